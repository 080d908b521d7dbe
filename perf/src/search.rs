//! Zero-loss throughput, RFC 2544 §26.1 style: a binary search over the
//! offered rate for the highest rate at which a trial loses no more than
//! the allowed fraction. Sans-IO: the caller runs the trials.

use serde::Serialize;

/// The search state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ZeroLossSearch {
    /// Highest rate that passed (pps), 0 if none yet.
    pub passed: f64,
    /// Lowest rate that failed (pps), the upper bound while none failed.
    pub failed: f64,
    /// Stop when `(failed - passed) / failed` is below this.
    pub resolution: f64,
    /// Stop after this many trials.
    pub max_trials: u32,
    /// Trials so far: (rate, passed).
    pub trials: Vec<(f64, bool)>,
    upper_tried: bool,
}

impl ZeroLossSearch {
    /// A search below `upper_pps` (e.g. the maximum-rate result), to a
    /// relative `resolution`, in at most `max_trials` trials.
    pub fn new(upper_pps: f64, resolution: f64, max_trials: u32) -> ZeroLossSearch {
        ZeroLossSearch {
            passed: 0.0,
            failed: upper_pps.max(1.0),
            resolution: resolution.clamp(1e-4, 0.5),
            max_trials: max_trials.max(1),
            trials: Vec::new(),
            upper_tried: false,
        }
    }

    /// The rate of the next trial, `None` when the search is done.
    pub fn next_rate(&self) -> Option<f64> {
        if self.trials.len() >= self.max_trials as usize {
            return None;
        }
        if !self.upper_tried {
            return Some(self.failed);
        }
        if (self.failed - self.passed) / self.failed < self.resolution {
            return None;
        }
        Some((self.passed + self.failed) / 2.0)
    }

    /// Records a trial's outcome.
    pub fn record(&mut self, rate: f64, passed: bool) {
        self.trials.push((rate, passed));
        if !self.upper_tried {
            self.upper_tried = true;
            if passed {
                // The upper bound itself loses nothing: that is the answer.
                self.passed = rate;
                self.failed = rate * (1.0 + self.resolution / 2.0);
                self.max_trials = self.trials.len() as u32;
                return;
            }
        }
        if passed {
            self.passed = self.passed.max(rate);
        } else {
            self.failed = self.failed.min(rate);
        }
    }

    /// The result: the highest rate that passed.
    pub fn result(&self) -> f64 {
        self.passed
    }

    /// Whether a trial passes: lost frames at most `allowed` of those sent.
    pub fn passes(sent: u64, lost: u64, allowed: f64) -> bool {
        sent > 0 && (lost as f64) <= allowed * sent as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the search against a device that loses frames above `capacity`.
    fn run(capacity: f64, upper: f64) -> ZeroLossSearch {
        let mut s = ZeroLossSearch::new(upper, 0.01, 30);
        while let Some(rate) = s.next_rate() {
            s.record(rate, rate <= capacity);
        }
        s
    }

    #[test]
    fn converges_to_the_capacity_within_the_resolution() {
        let s = run(437_000.0, 1_000_000.0);
        assert!(s.result() <= 437_000.0);
        assert!(s.result() >= 437_000.0 * 0.99, "result {}", s.result());
        assert!(s.trials.len() <= 10, "{} trials", s.trials.len());
        assert_eq!(
            s.trials[0],
            (1_000_000.0, false),
            "tries the upper bound first"
        );
    }

    #[test]
    fn an_upper_bound_that_passes_ends_the_search_at_once() {
        let s = run(2_000_000.0, 1_000_000.0);
        assert_eq!(s.result(), 1_000_000.0);
        assert_eq!(s.trials.len(), 1);
    }

    #[test]
    fn a_device_that_always_loses_gives_zero() {
        let s = run(0.0, 1_000_000.0);
        assert_eq!(s.result(), 0.0);
        assert!(s.trials.iter().all(|t| !t.1));
        assert!(s.trials.len() <= 30);
    }

    #[test]
    fn pass_criterion_allows_the_given_fraction_only() {
        assert!(ZeroLossSearch::passes(1000, 0, 0.0));
        assert!(!ZeroLossSearch::passes(1000, 1, 0.0));
        assert!(ZeroLossSearch::passes(1000, 1, 0.001));
        assert!(
            !ZeroLossSearch::passes(0, 0, 0.0),
            "an empty trial proves nothing"
        );
    }
}
