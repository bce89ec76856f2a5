//! `redis-server` processes of the test's own on free loopback ports.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::{closed_port, eventually, settled_within};

/// A `redis-server` of the test's own, on a free loopback port, with no persistence; killed
/// (and its directory removed) when dropped. `.ci/run` installs `redis-server` when missing.
pub(crate) struct RedisServer {
    pub(crate) port: u16,
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub(crate) fn start() -> Self {
        let port = closed_port();
        Self::start_on(port)
    }

    /// A server on `port` (to bring one back where a killed one was).
    pub(crate) fn start_on(port: u16) -> Self {
        Self::spawn(port, &[])
    }

    /// A replica of the server on `primary`'s port ([`RedisSentinel`]).
    pub(crate) fn start_replica_of(primary: u16) -> Self {
        let server = Self::spawn(
            closed_port(),
            &["--replicaof", "127.0.0.1", &primary.to_string()],
        );
        eventually("the replica is in sync", || {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut server.client())
                .unwrap_or_default();
            info.contains("master_link_status:up")
        });
        server
    }

    /// A node of a Redis Cluster, not yet joined ([`RedisCluster`]); a master it holds slots
    /// of is failed over 500 ms after it stops answering.
    pub(crate) fn start_cluster_node() -> Self {
        Self::spawn(
            super::closed_port_with(10_000),
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "500",
                "--repl-diskless-sync-delay",
                "0",
            ],
        )
    }

    fn spawn(port: u16, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                dir.path().to_str().unwrap(),
            ])
            .args(extra)
            .stdout(std::fs::File::create(dir.path().join("redis.log")).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect(
                "redis-server is installed (.ci/run installs it: apt-get install redis-server)",
            );
        let server = Self { port, child, dir };
        eventually("redis-server answers PING", || server.ping());
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// A synchronous client, for the test's own look at what the store holds.
    pub(crate) fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal by name (`STOP`, `CONT`, `KILL`).
    pub(crate) fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -s {name} redis-server failed");
    }

    /// Kill it and wait for it to be gone; the port is free again.
    pub(crate) fn kill(mut self) -> u16 {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.port
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A stopped server must be continued to die of a TERM; KILL works either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}

/// A Redis Cluster of `n` masters (no replicas), every slot covered; stopped when dropped.
pub(crate) struct RedisCluster {
    pub(crate) nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub(crate) fn start(n: usize) -> Self {
        Self::start_with(n, 0)
    }

    /// `masters` masters with `replicas` replicas each.
    pub(crate) fn start_with(masters: usize, replicas: usize) -> Self {
        let n = masters * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..n).map(|_| RedisServer::start_cluster_node()).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let out = std::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli is installed with redis-server");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes };
        eventually("the cluster covers every slot", || {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut cluster.nodes[0].client())
                .unwrap_or_default();
            info.contains("cluster_state:ok")
        });
        // Every replica in sync (a master killed before its replica has its data cannot be
        // failed over).
        for node in &cluster.nodes {
            eventually("the replicas are in sync", || {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut node.client())
                    .unwrap_or_default();
                info.contains("role:master") || info.contains("master_link_status:up")
            });
        }
        cluster
    }

    /// The port of the master that holds `key`'s slot, as the node on `via` sees it.
    fn master_of(&self, via: u16, key: &str) -> Option<u16> {
        let mut c = self.nodes.iter().find(|n| n.port == via)?.client();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c)
            .ok()?;
        let slots: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).ok()?;
        for range in slots {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let num = |v: Option<&redis::Value>| match v {
                Some(redis::Value::Int(n)) => Some(*n),
                _ => None,
            };
            let (Some(lo), Some(hi)) = (num(parts.first()), num(parts.get(1))) else {
                continue;
            };
            if (lo..=hi).contains(&slot) {
                let Some(redis::Value::Array(master)) = parts.get(2) else {
                    return None;
                };
                return num(master.get(1)).and_then(|p| u16::try_from(p).ok());
            }
        }
        None
    }

    /// The port of the master holding `key`'s slot now.
    pub(crate) fn master_port_of(&self, key: &str) -> u16 {
        self.master_of(self.nodes[0].port, key)
            .expect("a master holds the slot")
    }

    /// Kill the master holding `key`'s slot and wait until one of its replicas has taken
    /// the slot over and the cluster is whole again; the killed master's port.
    pub(crate) fn kill_master_of(&mut self, key: &str) -> u16 {
        let first = self.nodes[0].port;
        let old = self.master_of(first, key).expect("a master holds the slot");
        let at = self.nodes.iter().position(|n| n.port == old).unwrap();
        self.nodes.remove(at).kill();
        let via = self.nodes[0].port;
        eventually("a replica takes the slot over", || {
            let ok: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut self.nodes[0].client())
                .unwrap_or_default();
            ok.contains("cluster_state:ok") && self.master_of(via, key).is_some_and(|p| p != old)
        });
        old
    }

    /// Every name held by any node.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut all = Vec::new();
        for n in &self.nodes {
            let names: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut n.client()).unwrap();
            all.extend(names);
        }
        all.sort();
        all
    }
}

/// A primary, one replica and a `redis-sentinel` watching them as `tg` (quorum 1, down after
/// 300 ms), on free loopback ports; all stopped when dropped. `.ci/run` installs
/// `redis-sentinel` when missing.
pub(crate) struct RedisSentinel {
    pub(crate) primary: Option<RedisServer>,
    pub(crate) replica: RedisServer,
    pub(crate) port: u16,
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl RedisSentinel {
    pub(crate) fn start() -> Self {
        let primary = RedisServer::start();
        let replica = RedisServer::start_replica_of(primary.port);
        let dir = tempfile::tempdir().unwrap();
        let port = closed_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor tg 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds tg 300\n\
                 sentinel failover-timeout tg 5000\n",
                dir.path().display(),
                primary.port
            ),
        )
        .unwrap();
        let child = std::process::Command::new("redis-sentinel")
            .arg(&conf)
            .stdout(std::fs::File::create(dir.path().join("sentinel.log")).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect(
                "redis-sentinel is installed (.ci/run installs it: apt-get install redis-sentinel)",
            );
        let s = Self {
            primary: Some(primary),
            replica,
            port,
            child,
            dir,
        };
        let p = s.primary.as_ref().unwrap().port;
        eventually("Sentinel watches the primary and its replica", || {
            s.master_port() == Some(p) && s.replicas_known() >= 1
        });
        s
    }

    /// `redis+sentinel://` for the gateway.
    pub(crate) fn url(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/tg/0", self.port)
    }

    fn ask(&self) -> Option<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.port))
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()
    }

    /// The master's port, as Sentinel sees it now.
    pub(crate) fn master_port(&self) -> Option<u16> {
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("tg")
            .query(&mut self.ask()?)
            .ok()?;
        addr.get(1)?.parse().ok()
    }

    fn replicas_known(&self) -> usize {
        let Some(mut c) = self.ask() else { return 0 };
        let r: Vec<redis::Value> = redis::cmd("SENTINEL")
            .arg("replicas")
            .arg("tg")
            .query(&mut c)
            .unwrap_or_default();
        r.len()
    }

    /// Kill the primary and wait until Sentinel has promoted the replica. On a loaded machine
    /// (the suite runs beside this test's own load) Sentinel can abort an attempt whose
    /// promotion it did not see within `failover-timeout`, and tries again after twice that:
    /// the wait is bounded at a minute, and its failure shows Sentinel's own log.
    pub(crate) fn fail_over(&mut self) {
        let old = self.primary.take().expect("a primary to kill").kill();
        let new = self.replica.port;
        assert_ne!(old, new);
        let master = settled_within(
            Duration::from_secs(60),
            || self.master_port(),
            |p| *p == Some(new),
        );
        if master != Some(new) {
            let log =
                std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "Sentinel did not promote the replica (port {new}) within a minute; \
                 master now {master:?}; its log, newest first:\n{}",
                tail.join("\n")
            );
        }
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
