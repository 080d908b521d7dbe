//! The one polling helper: every test and the lab wait for a condition
//! (a socket answers, BGP is Established, a route arrived) the same way.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// The first pause between two polls; it doubles up to [`MAX_PAUSE`], so
/// a condition that holds soon is seen soon, and an expensive one (a CLI
/// exec'd in every node) is not run in a tight loop.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// Polls `ok` until it returns `Ok(true)`, returns an error (which ends
/// the wait at once: e.g. the daemon being waited for has exited), or
/// `timeout` passes (an error naming `what`). `ok` runs at least once.
pub fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> Result<bool>) -> Result<()> {
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        if ok()? {
            return Ok(());
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(pause.min(timeout - elapsed));
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_once_the_condition_holds() {
        let mut polls = 0;
        wait_for("the third poll", Duration::from_secs(5), || {
            polls += 1;
            Ok(polls == 3)
        })
        .unwrap();
        assert_eq!(polls, 3);
    }

    #[test]
    fn times_out_naming_what_it_waited_for() {
        let err = wait_for("never", Duration::from_millis(30), || Ok(false)).unwrap_err();
        assert!(err.to_string().contains("waiting for never"), "{err}");
    }

    #[test]
    fn an_error_from_the_condition_ends_the_wait_at_once() {
        let mut polls = 0;
        let err = wait_for("a dead daemon", Duration::from_secs(60), || {
            polls += 1;
            bail!("the daemon exited")
        })
        .unwrap_err();
        assert_eq!((polls, err.to_string()), (1, "the daemon exited".into()));
    }

    #[test]
    fn a_zero_timeout_still_polls_once() {
        let mut polls = 0;
        wait_for("now", Duration::ZERO, || {
            polls += 1;
            Ok(true)
        })
        .unwrap();
        assert_eq!(polls, 1);
    }
}
