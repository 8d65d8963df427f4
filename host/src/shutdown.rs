//! Signals: the first SIGTERM or Ctrl-C drains, a second one exits at once.

use tokio_util::sync::CancellationToken;

/// Exit status after a second signal, as a shell reports death by SIGINT.
pub const FORCED_EXIT_CODE: i32 = 130;

/// Returns a token cancelled on the first signal; a second signal exits the process.
pub fn install() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let cancel = token.clone();
    tokio::spawn(async move {
        for count in 0.. {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
            if count == 0 {
                tracing::info!("shutting down: finishing the current transaction (signal again to exit now)");
                cancel.cancel();
            } else {
                tracing::warn!("second signal: exiting now; uncommitted work will be redelivered");
                std::process::exit(FORCED_EXIT_CODE);
            }
        }
    });
    Ok(token)
}
