//! The keeper's background service.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::Keeper;

/// The keeper's tick: the calendar every 100 ms while anything is metered (every second
/// otherwise: a quota set live on a config without any is a second late at most), a pass
/// every second, a last pass at shutdown.
pub(crate) struct KeeperTick(pub Arc<Keeper>);

#[async_trait]
impl BackgroundService for KeeperTick {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut last_pass = std::time::Instant::now();
        loop {
            let live = &self.0.live;
            let snap = live.load();
            snap.policy.metering.calendar.set(crate::clock::wall_ms());
            if last_pass.elapsed() >= Duration::from_secs(1) {
                last_pass = std::time::Instant::now();
                self.pass();
            }
            // A quota set live is on its key (`has_own_quotas`) once applied: asked of the
            // policy, not of every record in force (a million, under the change lock, each
            // time round).
            let step = Duration::from_millis(if snap.policy.meters() { 100 } else { 1000 });
            drop(snap);
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                _ = shutdown.changed() => break,
            }
        }
        self.pass();
    }
}

impl KeeperTick {
    fn pass(&self) {
        if let Some(file) = &self.0.file {
            file.probe();
        }
        if let Err(e) = self.0.keep() {
            tracing::warn!(
                target: "tollgate::ledger",
                error = %e,
                "quota and ledger counts not kept; trying again in 1 s"
            );
        }
    }
}
