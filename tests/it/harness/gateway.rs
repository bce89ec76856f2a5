//! The gateway in this test process: a Pingora server on loopback ports with a stop on cue
//! and an injected clock, and the standard test config around it.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::runtime::live::LivePolicy;
use tollgate_core::testing::TestConfig;

use super::closed_port;
use super::http::{admin, send_raw, Response};
use super::upstream::Upstream;

/// The standard test config ([`TestConfig`]) on fresh loopback ports, in front of `upstream`
/// (a base URL).
pub(crate) fn test_config(upstream: &str) -> TestConfig {
    TestConfig::new()
        .listen(format!("127.0.0.1:{}", closed_port()))
        .admin_listen(format!("127.0.0.1:{}", closed_port()))
        .upstream(upstream)
}

/// [`test_config`] in front of the recording upstream `up`.
pub(crate) fn config_for(up: &Upstream) -> TestConfig {
    test_config(&format!("http://{}", up.addr))
}

/// A shutdown signal driven by a channel, so a server can run inside a test and stop on cue.
struct ChannelShutdown(tokio::sync::Mutex<tokio::sync::mpsc::Receiver<ShutdownSignal>>);

#[async_trait]
impl ShutdownSignalWatch for ChannelShutdown {
    async fn recv(&self) -> ShutdownSignal {
        self.0
            .lock()
            .await
            .recv()
            .await
            .unwrap_or(ShutdownSignal::FastShutdown)
    }
}

/// A server running on a background thread, stopped (and joined) when dropped.
pub(crate) struct Running {
    tx: tokio::sync::mpsc::Sender<ShutdownSignal>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Start `server` on its own thread (Pingora builds its own runtimes).
    pub(crate) fn spawn(server: Server) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let thread = std::thread::spawn(move || {
            server.run(RunArgs {
                shutdown_signal: Box::new(ChannelShutdown(tokio::sync::Mutex::new(rx))),
            })
        });
        Self {
            tx,
            thread: Some(thread),
        }
    }

    fn shutdown(&mut self) {
        let _ = self.tx.try_send(ShutdownSignal::FastShutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown();
    }
}

pub(crate) struct Gateway {
    pub(crate) addr: SocketAddr,
    pub(crate) clock: Arc<ManualClock>,
    pub(crate) config: Config,
    /// The config in force, for reloads from the test.
    pub(crate) live: Arc<LivePolicy>,
    _running: Running,
}

impl Gateway {
    /// A gateway serving `config`.
    pub(crate) fn start(config: &TestConfig) -> Self {
        Self::start_config(config.parse())
    }

    pub(crate) fn start_config(config: Config) -> Self {
        let clock = Arc::new(ManualClock::new());
        let addr = config.process.listen;
        let built =
            tollgate::server::build(config.clone(), clock.clone(), None).expect("server builds");
        let live = built.live;
        let running = Running::spawn(built.server);
        // Both listeners: Pingora starts its services one by one, so the proxy's port open
        // says nothing of the admin port's.
        wait_listening(addr);
        wait_listening(config.process.admin_listen);
        Self {
            addr,
            clock,
            config,
            live,
            _running: running,
        }
    }

    /// A gateway serving the config file at `path` (so that reloads re-read it).
    pub(crate) fn start_file(path: &Path) -> Self {
        Self::start_config(Config::load(path).expect("valid test config"))
    }

    /// A gateway with the standard test config in front of `upstream`.
    pub(crate) fn with(upstream: &Upstream) -> Self {
        Self::start(&config_for(upstream))
    }

    pub(crate) fn send(&self, raw: &[u8]) -> Response {
        send_raw(self.addr, raw)
    }

    /// A request with `Connection: close`, `Host`, and the given headers and body.
    pub(crate) fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        let mut raw =
            format!("{method} {path} HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n");
        for (n, v) in headers {
            raw.push_str(&format!("{n}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" {
            raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        raw.push_str("\r\n");
        let mut bytes = raw.into_bytes();
        bytes.extend_from_slice(body);
        self.send(&bytes)
    }

    /// `METHOD path` on the admin listener.
    pub(crate) fn admin(&self, method: &str, path: &str) -> Response {
        admin(self.config.process.admin_listen, method, path)
    }

    /// `request` with `Authorization: Bearer <key>` and, for a body, JSON content type.
    pub(crate) fn call(&self, key: &str, method: &str, path: &str, body: &str) -> Response {
        let auth = format!("Bearer {key}");
        let mut h = vec![("Authorization", auth.as_str())];
        if !body.is_empty() {
            h.push(("Content-Type", "application/json"));
        }
        self.request(method, path, &h, body.as_bytes())
    }
}

pub(crate) fn wait_listening(addr: SocketAddr) {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{addr} never started listening");
}
