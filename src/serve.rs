//! Serving: the Pingora server built from a [`Config`], for `run`, `demo` and the tests.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::listeners::tls::TlsSettings;
use pingora::prelude::Opt;
use pingora::proxy::http_proxy_service_with_name;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};

use crate::clock::Clock;
use crate::config::{Config, LogFormat};
use crate::forward::Gateway;
use crate::live::LivePolicy;

/// Seconds in-flight requests get to finish after SIGTERM before the process exits.
pub const DEFAULT_GRACE_SECONDS: u64 = 10;

/// Pingora's server settings when no `--conf` file is given.
pub fn default_server_conf() -> ServerConf {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    ServerConf {
        threads,
        grace_period_seconds: Some(DEFAULT_GRACE_SECONDS),
        graceful_shutdown_timeout_seconds: Some(5),
        ..ServerConf::default()
    }
}

/// Build the server: the gateway on `listen` (and the TLS listener, if configured).
/// Refuses a TLS certificate or key that does not load, instead of letting the listener panic.
pub fn build(
    config: Config,
    clock: Arc<dyn Clock>,
    opt: Option<Opt>,
) -> Result<(Server, Arc<LivePolicy>), String> {
    let conf = match opt.as_ref().filter(|o| o.conf.is_some()) {
        Some(o) => ServerConf::load_yaml_with_opt_override(o)
            .map_err(|e| format!("pingora --conf: {e}"))?,
        None => default_server_conf(),
    };
    let upgrade = opt.as_ref().is_some_and(|o| o.upgrade);
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    if upgrade {
        // Take the listening sockets over from the running process (zero-downtime upgrade).
        server.bootstrap();
    }
    let listen = config.listen.to_string();
    let tls = config.tls.clone();
    let live = Arc::new(LivePolicy::new(config));
    let gateway = Gateway::new(Arc::clone(&live), clock)?;
    let mut svc = http_proxy_service_with_name(&server.configuration, gateway, "tollgate");
    svc.add_tcp(&listen);
    if let Some(t) = tls {
        let (cert, key) = (
            t.cert_file.to_string_lossy().into_owned(),
            t.key_file.to_string_lossy().into_owned(),
        );
        match pingora::tls::load_certs_and_key_files(&cert, &key) {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(format!(
                    "tls: no certificate in {cert} or no private key in {key}"
                ))
            }
            Err(e) => return Err(format!("tls: cannot load {cert} / {key}: {:?}", e.etype())),
        }
        let mut settings =
            TlsSettings::intermediate(&cert, &key).map_err(|e| format!("tls: {:?}", e.etype()))?;
        settings.enable_h2();
        svc.add_tls_with_settings(&t.listen.to_string(), None, settings);
    }
    server.add_service(svc);
    Ok((server, live))
}

/// Install the log subscriber. Pingora logs through the `log` crate, raw request bytes
/// included; no bridge from `log` is installed, so none of that can reach the output.
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("TOLLGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => tracing::subscriber::set_global_default(builder.finish()),
        LogFormat::Json => tracing::subscriber::set_global_default(builder.json().finish()),
    };
}

/// A shutdown signal driven by a channel, so a server can run inside a test and stop on cue.
pub struct ChannelShutdown(tokio::sync::Mutex<tokio::sync::mpsc::Receiver<ShutdownSignal>>);

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

/// A server running on a background thread.
pub struct Running {
    tx: tokio::sync::mpsc::Sender<ShutdownSignal>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Start `server` on its own thread (Pingora builds its own runtimes).
    pub fn spawn(server: Server) -> Self {
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

    /// Stop at once and wait for the thread.
    pub fn stop(mut self) {
        self.shutdown();
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
