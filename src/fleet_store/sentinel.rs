//! Redis behind Sentinel: where the master is, and one connection to it.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::IntoConnectionInfo;

use super::no_delay;
use crate::config::SentinelUrl;
use crate::sync::Locked;

/// Redis behind Sentinel: the master's address asked of the Sentinels, and one multiplexed
/// connection to it, kept until a call fails in a way that says the master may have moved
/// (the connection dropped or refused, no answer in time, `READONLY` from a demoted master);
/// the next call asks the Sentinels again. A failover thus costs the calls of the moment it
/// takes Sentinel to promote a replica, each within `timeout_ms`: no request waits on them.
pub(crate) struct SentinelLink {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    conn: std::sync::Mutex<Option<MultiplexedConnection>>,
    config: redis::AsyncConnectionConfig,
}

impl SentinelLink {
    pub(super) fn new(url: &SentinelUrl, timeout: Duration) -> redis::RedisResult<Self> {
        // The master's user, password and database, as a `redis://` URL would give them.
        let node = url
            .node_url("sentinel-master:6379")
            .into_connection_info()?;
        let mut info = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(node.redis_settings().clone())
            .set_tcp_settings(no_delay());
        if url.tls {
            info = info.set_tls_mode(redis::TlsMode::Secure);
        }
        let sentinels: Vec<String> = url
            .sentinels
            .iter()
            .map(|a| format!("redis://{a}"))
            .collect();
        let client = SentinelClient::build(
            sentinels,
            url.master.as_str(),
            Some(info),
            SentinelServerType::Master,
        )?;
        Ok(Self {
            sentinel: tokio::sync::Mutex::new(client),
            conn: std::sync::Mutex::new(None),
            config: redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout)),
        })
    }

    /// The connection to the master, asking the Sentinels where it is when there is none.
    pub(super) async fn conn(&self) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(c) = self.slot().clone() {
            return Ok(c);
        }
        let master = self.sentinel.lock().await.async_get_client().await?;
        let c = master
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        *self.slot() = Some(c.clone());
        Ok(c)
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.conn.locked()
    }

    /// A call's result; one that says the master may have moved drops the connection.
    pub(super) fn check<T>(&self, r: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if let Err(e) = &r {
            let moved = e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout()
                || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
            if moved {
                self.slot().take();
            }
        }
        r
    }
}
