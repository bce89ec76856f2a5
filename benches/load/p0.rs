//! P0 — the bare Pingora pass-through of the load benchmark (benches/load/run.sh).
//!
//! Same Pingora version and features as the gateway (the crate's own dependency), no policy:
//! every request goes to one fixed upstream over a pooled keep-alive connection, the request
//! and the answer untouched. This is the floor Tollgate is compared against.
//!
//!   cargo build --release --locked --example p0
//!   target/release/examples/p0 127.0.0.1:41082 127.0.0.1:41081 1
//!   (listen address, upstream address, worker threads)
//!   target/release/examples/p0 127.0.0.1:41082 127.0.0.1:41081 1 runtime.yaml
//!   (the same, with the runtime settings of a Pingora settings file: `threads`,
//!   `work_stealing`, `upstream_keepalive_pool_size`, `listener_tasks_per_fd`; the file's
//!   `threads` wins over the argument, so that P0 runs what the gateway runs)
//!
//! SIGINT exits at once (Pingora's fast shutdown); SIGTERM is a graceful terminate without a
//! grace period.
//!
//! P0 runs the system allocator (glibc malloc); P0m (`p0m.rs`) is this same program with
//! Tollgate's allocator, the like-for-like baseline.

use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;
use pingora::prelude::HttpPeer;
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::Result;

struct PassThrough {
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for PassThrough {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.upstream, false, String::new());
        // The same idle timeout the gateway gives pooled upstream connections.
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        Ok(Box::new(peer))
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: p0 LISTEN_ADDR UPSTREAM_ADDR THREADS [PINGORA_CONF]   (e.g. p0 127.0.0.1:41082 127.0.0.1:41081 1)"
    );
    std::process::exit(2)
}

/// Parse the arguments and run the pass-through (`p0m.rs` calls it too).
pub(crate) fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !(3..=4).contains(&args.len()) {
        usage();
    }
    let listen = args[0].clone();
    let upstream: SocketAddr = args[1].parse().unwrap_or_else(|_| usage());
    let threads: usize = match args[2].parse() {
        Ok(n) if n > 0 => n,
        _ => usage(),
    };
    let base = match args.get(3) {
        Some(path) => ServerConf::load_from_yaml(path).unwrap_or_else(|e| {
            eprintln!("p0: {path}: {e}");
            std::process::exit(2)
        }),
        None => ServerConf {
            threads,
            ..ServerConf::default()
        },
    };
    let conf = ServerConf {
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..base
    };
    let threads = conf.threads;
    let stealing = conf.work_stealing;
    let mut server = Server::new_with_opt_and_conf(None, conf);
    let mut svc = http_proxy_service(&server.configuration, PassThrough { upstream });
    svc.add_tcp(&listen);
    server.add_service(svc);
    eprintln!("p0: {listen} -> {upstream}, {threads} thread(s), work stealing {stealing}");
    server.run_forever()
}
