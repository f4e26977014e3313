//! The service's stop switch, as the background tasks wait for it.

use tokio::sync::watch;

/// Resolves when `rx` is (or becomes) true, or its sender is gone.
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
