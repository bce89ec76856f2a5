//! The one room that speaks to Redis (or Valkey): one client type, one way to connect, one way
//! to call a script, one typed error. The features that keep state there — shared budgets
//! ([`crate::shared`]) and the key changes ([`crate::keys`]) — are rooms of their own above
//! this one; each keeps its Lua in `.lua` files beside its code, loaded with `include_str!`.
//!
//! | piece | what |
//! |---|---|
//! | [`Client`] | a single Redis through a reconnecting connection manager, a Redis Cluster, or Redis behind Sentinel ([`SentinelLink`]) |
//! | [`Client::held`], [`Hold`] | behind Sentinel or on a Redis Cluster, whether a replica holds what was written (acknowledge only that) |
//! | [`connect`] | the client the `cluster` block names, within its timeout |
//! | [`Lua`] | a script: invoked alone or laid out as `EVALSHA` in a pipeline, from one place |
//! | [`StoreError`] | why a call failed, never with the URL (it may hold a password) |

use std::sync::Arc;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, RedisError};

use crate::config::{scrub, Cluster, SentinelUrl};

mod client;
mod cluster;
mod lua;
mod sentinel;

pub(crate) use client::{Client, Hold};
pub(crate) use lua::Lua;
pub(crate) use sentinel::SentinelLink;

use cluster::{cluster, known_nodes};

/// Why a call to Redis failed. Its text never holds the store's URL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Redis answered with an error, or the connection failed (the message, scrubbed).
    #[error("{0}")]
    Redis(String),
    /// The script is not loaded there (after a restart or a failover).
    #[error("the script is not loaded")]
    NoScript,
    /// No connection within the timeout.
    #[error("no connection within timeout_ms")]
    ConnectTimeout,
    /// No answer within the timeout.
    #[error("no answer within timeout_ms")]
    Timeout,
    /// An answer of another shape than the script's.
    #[error("{0}")]
    Malformed(&'static str),
    /// Behind Sentinel or on a Redis Cluster: written to the master, but no replica confirmed
    /// it within the timeout (a failover now could lose it).
    #[error("no replica confirmed the write within timeout_ms")]
    NotReplicated,
}

impl StoreError {
    /// The error of a call to the store at `url`, scrubbed of the URL.
    pub fn of(e: &RedisError, url: &str) -> Self {
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
            return StoreError::NoScript;
        }
        StoreError::Redis(scrub(&e.to_string(), url))
    }
}

/// `call` within `deadline`; its error scrubbed of `url`.
pub(crate) async fn within<T>(
    deadline: tokio::time::Instant,
    url: &str,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(StoreError::of(&e, url)),
        Err(_) => Err(StoreError::Timeout),
    }
}

/// Every connection to the store with `TCP_NODELAY` (redis-rs leaves Nagle's algorithm on): a
/// small write on a connection with a write unacknowledged (a request's exchange beside a
/// tick's) would otherwise wait for the acknowledgement, up to a round trip, or the
/// receiver's delayed-ACK timer (40 ms on Linux) on a quiet link.
fn no_delay() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// Connect to the store `cfg` names, within its timeout: a Redis Cluster when the server says
/// `cluster_enabled:1`, else one Redis through a reconnecting connection manager.
pub(crate) async fn connect(cfg: &Cluster) -> Result<Client, StoreError> {
    match tokio::time::timeout(cfg.timeout, open(cfg)).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::ConnectTimeout),
    }
}

async fn open(cfg: &Cluster) -> Result<Client, StoreError> {
    let url = cfg.redis_url.as_str();
    let fail = |e: RedisError| StoreError::of(&e, url);
    let t = cfg.timeout;
    if let Some(sentinel) = SentinelUrl::parse(url) {
        let sentinel = sentinel.map_err(StoreError::Redis)?;
        let link = SentinelLink::new(&sentinel, t).map_err(fail)?;
        // The master found and answering, as a single Redis's first connection is.
        link.conn().await.map_err(fail)?;
        return Ok(Client::Sentinel(Arc::new(link)));
    }
    // A Redis Cluster this process reached before: start from every node it knew, so that
    // losing the configured node (a failover) does not lose the cluster.
    let known = known_nodes(url);
    let probe = async {
        let client = redis::Client::open(url.into_connection_info()?.set_tcp_settings(no_delay()))?;
        let mut probe = client
            .get_multiplexed_async_connection_with_config(
                &redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(t))
                    .set_response_timeout(Some(t)),
            )
            .await?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut probe)
            .await?;
        Ok::<_, RedisError>((client, info.contains("cluster_enabled:1")))
    };
    let client = match probe.await {
        Ok((_, true)) => return cluster(cfg, known).await,
        Ok((client, false)) => client,
        Err(_) if !known.is_empty() => return cluster(cfg, known).await,
        Err(e) => return Err(fail(e)),
    };
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(t))
        .set_response_timeout(Some(t))
        .set_number_of_retries(1)
        .set_max_delay(cfg.sync_interval);
    let manager = ConnectionManager::new_with_config(client, config)
        .await
        .map_err(fail)?;
    Ok(Client::Single(manager))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_carry_the_password() {
        let e = RedisError::from(std::io::Error::other("auth failed for redis://:s3cret@h"));
        let f = StoreError::of(&e, "redis://:s3cret@h:6379");
        assert!(!f.to_string().contains("s3cret"), "{f}");
    }
}
