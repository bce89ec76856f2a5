//! The one room that speaks to Redis (or Valkey): one client type, one way to connect, one way
//! to call a script, one typed error. The features that keep state there — shared budgets
//! ([`crate::shared`]) and the overrides ([`crate::overrides`]) — are rooms of their own above
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
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    Cmd, FromRedisValue, IntoConnectionInfo, Pipeline, RedisError, RedisResult, Script, Value,
};

use crate::config::{at_address, scrub, Cluster, SentinelUrl};

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

/// A connection to a single Redis (reconnecting by itself) or to a Redis Cluster; cheap to
/// clone (both are handles on shared connections).
#[derive(Clone)]
pub enum Client {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
    Sentinel(Arc<SentinelLink>),
}

impl Client {
    /// Run one command.
    pub async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self.clone() {
            Client::Single(mut c) => cmd.query_async(&mut c).await,
            Client::Cluster(mut c) => cmd.query_async(&mut c).await,
            Client::Sentinel(s) => {
                let mut c = s.conn().await?;
                s.check(cmd.query_async(&mut c).await)
            }
        }
    }

    /// Run a pipeline (on a Redis Cluster, every command of it must name one slot).
    pub async fn pipeline<T: FromRedisValue>(&self, pipe: &Pipeline) -> redis::RedisResult<T> {
        match self.clone() {
            Client::Single(mut c) => pipe.query_async(&mut c).await,
            Client::Cluster(mut c) => pipe.query_async(&mut c).await,
            Client::Sentinel(s) => {
                let mut c = s.conn().await?;
                s.check(pipe.query_async(&mut c).await)
            }
        }
    }

    /// Whether writes must be held by a replica before they are acknowledged: behind
    /// Sentinel or on a Redis Cluster, a failover promotes a replica, which has only what
    /// reached it.
    pub fn replicated(&self) -> bool {
        matches!(self, Client::Sentinel(_) | Client::Cluster(_))
    }

    /// Where writes must be held ([`Client::replicated`]), whether a replica holds what this
    /// client wrote to `key`'s master (or that master has no replica); elsewhere, yes. On a
    /// Redis Cluster the pipeline goes to `key`'s node (an `EXISTS` routes it), on the
    /// connection the writes took.
    pub async fn held(&self, hold: &Hold, key: &str, timeout: Duration) -> RedisResult<bool> {
        if !self.replicated() {
            return Ok(true);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("EXISTS").arg(key);
        for c in hold.commands(timeout) {
            pipe.add_command(c);
        }
        let answers: Vec<Value> = self.pipeline(&pipe).await?;
        Ok(matches!(answers.as_slice(), [_, wait, role] if hold.read(wait, role)))
    }

    /// Load `lua` into the store (after `NOSCRIPT`).
    pub async fn load(&self, lua: &Lua) -> redis::RedisResult<String> {
        self.query(&lua.load_cmd()).await
    }

    /// Run `cmd`, a call of `lua` ([`Lua::evalsha`]); on `NOSCRIPT` the script is loaded and
    /// the call sent once more.
    pub async fn call<T: FromRedisValue>(&self, lua: &Lua, cmd: &Cmd) -> redis::RedisResult<T> {
        match self.query(cmd).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.load(lua).await?;
                self.query(cmd).await
            }
            r => r,
        }
    }
}

/// Whether one master's writes are held by a replica: the commands that, sent after writes
/// (alone or at the end of their pipeline, on the same connection), tell it, and what the
/// master said of its replicas last time. `WAIT 1` waits up to its timeout when the master
/// has no replica, so a master whose last `ROLE` listed none is asked `WAIT 0` (at once):
/// with no replica there is none to fail over to, and its acknowledgement stands.
#[derive(Debug)]
pub struct Hold {
    replicas: std::sync::atomic::AtomicBool,
}

impl Default for Hold {
    /// Until a master says otherwise, it has replicas.
    fn default() -> Self {
        Self {
            replicas: std::sync::atomic::AtomicBool::new(true),
        }
    }
}

impl Hold {
    /// `WAIT` (1 replica within `timeout`, or 0 when the master had none), then `ROLE`.
    pub fn commands(&self, timeout: Duration) -> [Cmd; 2] {
        let replicas = self.replicas.load(std::sync::atomic::Ordering::Relaxed);
        let mut wait = redis::cmd("WAIT");
        if replicas {
            wait.arg(1).arg(timeout.as_millis().max(1) as u64);
        } else {
            wait.arg(0).arg(1);
        }
        [wait, redis::cmd("ROLE")]
    }

    /// What [`Hold::commands`] answered: held when a replica acknowledged (`WAIT` ≥ 1) or the
    /// master lists no replica (`ROLE`); what `ROLE` said is kept for the next time.
    pub fn read(&self, wait: &Value, role: &Value) -> bool {
        let none = match role {
            Value::Array(parts) => matches!(parts.get(2), Some(Value::Array(r)) if r.is_empty()),
            _ => false,
        };
        self.replicas
            .store(!none, std::sync::atomic::Ordering::Relaxed);
        none || matches!(wait, Value::Int(n) if *n >= 1)
    }
}

/// Redis behind Sentinel: the master's address asked of the Sentinels, and one multiplexed
/// connection to it, kept until a call fails in a way that says the master may have moved
/// (the connection dropped or refused, no answer in time, `READONLY` from a demoted master);
/// the next call asks the Sentinels again. A failover thus costs the calls of the moment it
/// takes Sentinel to promote a replica, each within `timeout_ms`: no request waits on them.
pub struct SentinelLink {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    conn: std::sync::Mutex<Option<MultiplexedConnection>>,
    config: redis::AsyncConnectionConfig,
}

impl SentinelLink {
    fn new(url: &SentinelUrl, timeout: Duration) -> redis::RedisResult<Self> {
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
    async fn conn(&self) -> redis::RedisResult<MultiplexedConnection> {
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
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call's result; one that says the master may have moved drops the connection.
    fn check<T>(&self, r: redis::RedisResult<T>) -> redis::RedisResult<T> {
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

/// A Lua script of one of the rooms above. redis-rs's own `ScriptInvocation` cannot be put in
/// a pipeline (its command is private to the crate), so every call, alone or pipelined, is
/// laid out here: `EVALSHA sha numkeys KEYS… ARGV…`.
pub struct Lua {
    source: &'static str,
    script: Script,
}

impl Lua {
    /// A script from its source (a `.lua` file, `include_str!`-ed).
    pub fn new(source: &'static str) -> Self {
        Self {
            source,
            script: Script::new(source),
        }
    }

    /// The SHA-1 of the source, as Redis names a loaded script.
    pub fn hash(&self) -> &str {
        self.script.get_hash()
    }

    /// A call with `keys`, as one command (for [`Client::call`], [`Client::query`] or a
    /// pipeline); its `ARGV` follow with `.arg(…)`.
    pub fn evalsha(&self, keys: &[&str]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.hash()).arg(keys.len());
        for k in keys {
            cmd.arg(*k);
        }
        cmd
    }

    /// `SCRIPT LOAD` of the source.
    fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.source);
        cmd
    }
}

/// `call` within `deadline`; its error scrubbed of `url`.
pub async fn within<T>(
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
pub async fn connect(cfg: &Cluster) -> Result<Client, StoreError> {
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

/// A connection to the Redis Cluster `cfg` names, starting from its URL and the nodes `known`
/// (URLs); the nodes it has now are remembered for the next.
async fn cluster(cfg: &Cluster, known: Vec<String>) -> Result<Client, StoreError> {
    let url = cfg.redis_url.as_str();
    let fail = |e: RedisError| StoreError::of(&e, url);
    let t = cfg.timeout;
    let mut initial = vec![url.to_string()];
    initial.extend(known.into_iter().filter(|k| k != url));
    let cluster = redis::cluster::ClusterClient::builder(initial)
        .connection_timeout(t)
        .response_timeout(t)
        .retries(0)
        .tcp_settings(no_delay())
        .build()
        .map_err(fail)?;
    let mut conn = cluster.get_async_connection().await.map_err(fail)?;
    let nodes: RedisResult<String> = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await;
    if let Ok(nodes) = nodes {
        remember_nodes(url, &nodes);
    }
    Ok(Client::Cluster(conn))
}

/// The nodes of each Redis Cluster this process reached, by the URL it was configured with,
/// as URLs with that URL's credentials and database.
static CLUSTER_NODES: std::sync::Mutex<Vec<(String, Vec<String>)>> =
    std::sync::Mutex::new(Vec::new());

fn known_nodes(url: &str) -> Vec<String> {
    let known = CLUSTER_NODES.lock().unwrap_or_else(|e| e.into_inner());
    known
        .iter()
        .find(|(u, _)| u == url)
        .map(|(_, nodes)| nodes.clone())
        .unwrap_or_default()
}

/// Keep the addresses `CLUSTER NODES` lists (`<id> <ip:port@bus> <flags> ...`, nodes marked
/// failed or without an address left out), as URLs like `url`.
fn remember_nodes(url: &str, listing: &str) {
    let nodes: Vec<String> = listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let addr = fields.nth(1)?.split(['@', ',']).next()?;
            let flags = fields.next()?;
            if flags.contains("fail") || flags.contains("noaddr") {
                return None;
            }
            at_address(url, addr)
        })
        .collect();
    if nodes.is_empty() {
        return;
    }
    let mut known = CLUSTER_NODES.lock().unwrap_or_else(|e| e.into_inner());
    known.retain(|(u, _)| u != url);
    known.push((url.to_string(), nodes));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_held_by_a_replica_or_by_a_master_without_one() {
        let arg = |c: &Cmd, i: usize| match c.args_iter().nth(i) {
            Some(redis::Arg::Simple(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        };
        let hold = Hold::default();
        let [wait, _] = hold.commands(Duration::from_millis(50));
        assert_eq!((arg(&wait, 1), arg(&wait, 2)), ("1".into(), "50".into()));
        let replica = Value::Array(vec![
            Value::SimpleString("127.0.0.1".into()),
            Value::SimpleString("6380".into()),
            Value::SimpleString("0".into()),
        ]);
        let role = |replicas: Vec<Value>| {
            Value::Array(vec![
                Value::BulkString(b"master".to_vec()),
                Value::Int(7),
                Value::Array(replicas),
            ])
        };
        assert!(hold.read(&Value::Int(1), &role(vec![replica.clone()])));
        assert!(!hold.read(&Value::Int(0), &role(vec![replica])), "not held");
        // A master with no replica: held, and the next WAIT does not wait.
        assert!(hold.read(&Value::Int(0), &role(vec![])));
        let [wait, _] = hold.commands(Duration::from_millis(50));
        assert_eq!(arg(&wait, 1), "0");
        assert!(!hold.read(&Value::Nil, &Value::Nil), "no answer: not held");
    }

    #[test]
    fn a_clusters_nodes_are_remembered_as_urls_with_the_credentials() {
        let url = "redis://:pw@10.0.0.1:7000/0";
        remember_nodes(
            url,
            "a1 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
             b2 10.0.0.2:7001@17001,host-b master - 0 0 2 connected 5461-10922\n\
             c3 10.0.0.3:7002@17002 master,fail - 0 0 3 disconnected\n\
             d4 :0@0 slave,noaddr - 0 0 3 disconnected\n",
        );
        assert_eq!(
            known_nodes(url),
            ["redis://:pw@10.0.0.1:7000/0", "redis://:pw@10.0.0.2:7001/0"]
        );
        assert!(known_nodes("redis://other:1").is_empty());
    }

    #[test]
    fn errors_never_carry_the_password() {
        let e = RedisError::from(std::io::Error::other("auth failed for redis://:s3cret@h"));
        let f = StoreError::of(&e, "redis://:s3cret@h:6379");
        assert!(!f.to_string().contains("s3cret"), "{f}");
    }

    #[test]
    fn a_call_is_laid_out_as_evalsha() {
        let lua = Lua::new("return 1");
        let mut cmd = lua.evalsha(&["k1", "k2"]);
        cmd.arg("a").arg(7u64);
        let args: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<other>".into(),
            })
            .collect();
        assert_eq!(args, ["EVALSHA", lua.hash(), "2", "k1", "k2", "a", "7"]);
        assert_eq!(lua.hash().len(), 40);
    }
}
