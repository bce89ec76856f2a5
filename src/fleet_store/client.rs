//! The client: one Redis through a reconnecting connection manager, a Redis Cluster, or Redis
//! behind Sentinel, with one way to run a command, a pipeline or a script on any of them; and
//! [`Hold`], whether a replica holds what was written.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Cmd, FromRedisValue, Pipeline, RedisResult, Value};

use super::{Lua, SentinelLink};

/// A connection to a single Redis (reconnecting by itself) or to a Redis Cluster; cheap to
/// clone (both are handles on shared connections).
#[derive(Clone)]
pub(crate) enum Client {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
    Sentinel(Arc<SentinelLink>),
}

impl Client {
    /// Run one command.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> redis::RedisResult<T> {
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
    pub(crate) async fn pipeline<T: FromRedisValue>(
        &self,
        pipe: &Pipeline,
    ) -> redis::RedisResult<T> {
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
    pub(crate) fn replicated(&self) -> bool {
        matches!(self, Client::Sentinel(_) | Client::Cluster(_))
    }

    /// Where writes must be held ([`Client::replicated`]), whether a replica holds what this
    /// client wrote to `key`'s master (or that master has no replica); elsewhere, yes. On a
    /// Redis Cluster the pipeline goes to `key`'s node (an `EXISTS` routes it), on the
    /// connection the writes took.
    pub(crate) async fn held(
        &self,
        hold: &Hold,
        key: &str,
        timeout: Duration,
    ) -> RedisResult<bool> {
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
    pub(crate) async fn load(&self, lua: &Lua) -> redis::RedisResult<String> {
        self.query(&lua.load_cmd()).await
    }

    /// Run `cmd`, a call of `lua` ([`Lua::evalsha`]); on `NOSCRIPT` the script is loaded and
    /// the call sent once more.
    pub(crate) async fn call<T: FromRedisValue>(
        &self,
        lua: &Lua,
        cmd: &Cmd,
    ) -> redis::RedisResult<T> {
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
pub(crate) struct Hold {
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
    pub(crate) fn commands(&self, timeout: Duration) -> [Cmd; 2] {
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
    pub(crate) fn read(&self, wait: &Value, role: &Value) -> bool {
        let none = match role {
            Value::Array(parts) => matches!(parts.get(2), Some(Value::Array(r)) if r.is_empty()),
            _ => false,
        };
        self.replicas
            .store(!none, std::sync::atomic::Ordering::Relaxed);
        none || matches!(wait, Value::Int(n) if *n >= 1)
    }
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
}
