//! SIGINT and SIGTERM as a stop flag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;

/// Sets `stop` on SIGINT or SIGTERM, from a small thread of its own.
pub fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    let flag = stop.clone();
    // Registering here, before the thread starts, means a signal that
    // arrives right after `run` prints "running" is not lost.
    let (mut term, mut int) = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            });
            flag.store(true, Ordering::Relaxed);
        })
        .context("signal thread")?;
    Ok(stop)
}
