//! Serving: the Pingora server built from a [`Config`], for `run`, `demo` and the tests:
//! the gateway listener(s), the admin listener, and the background services of
//! [`crate::lifecycle`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::apps::http_app::HttpServer;
use pingora::listeners::tls::TlsSettings;
use pingora::prelude::Opt;
use pingora::proxy::http_proxy_service_with_name;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::Admin;
use crate::clock::Clock;
use crate::config::{Config, LogFormat};
use crate::forward::Gateway;
use crate::lifecycle::{Health, ReadinessProbe, ReloadOnHangup, Signals};
use crate::live::LivePolicy;
use crate::metrics::Metrics;

/// Pingora's server settings when no `--conf` file is given: one worker thread per CPU.
pub fn default_server_conf() -> ServerConf {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    ServerConf {
        threads,
        ..ServerConf::default()
    }
}

/// A server ready to run, and the handles the caller may need.
pub struct Built {
    pub server: Server,
    pub live: Arc<LivePolicy>,
    /// The signal handling of [`crate::lifecycle`], for `Server::run`.
    pub signals: Signals,
}

impl Built {
    /// Serve until a signal ends the process (see [`crate::lifecycle`]).
    pub fn run(self) {
        self.server.run(RunArgs {
            shutdown_signal: Box::new(self.signals),
        });
    }
}

/// Build the server: the gateway on `listen` (and the TLS listener, if configured), the admin
/// listener on `admin_listen`, the SIGHUP reloader and the readiness probe.
///
/// Refuses, with a message, what Pingora would otherwise panic on later: a listen address
/// that cannot be bound (unless `--upgrade` takes the sockets over), or a TLS certificate or
/// key that does not load.
pub fn build(config: Config, clock: Arc<dyn Clock>, opt: Option<Opt>) -> Result<Built, String> {
    let mut conf = match opt.as_ref().filter(|o| o.conf.is_some()) {
        Some(o) => ServerConf::load_yaml_with_opt_override(o)
            .map_err(|e| format!("pingora --conf: {e}"))?,
        None => default_server_conf(),
    };
    conf.grace_period_seconds = Some(config.shutdown.grace_seconds);
    conf.graceful_shutdown_timeout_seconds = Some(config.shutdown.timeout_seconds);
    let upgrade = opt.as_ref().is_some_and(|o| o.upgrade);
    if !upgrade {
        let mut addrs = vec![
            ("listen", config.listen),
            ("admin_listen", config.admin_listen),
        ];
        addrs.extend(config.tls.as_ref().map(|t| ("tls.listen", t.listen)));
        for (field, addr) in addrs {
            std::net::TcpListener::bind(addr).map_err(|e| {
                format!(
                    "{}: field `{field}`: cannot listen on {addr}: {e}",
                    config.source.display()
                )
            })?;
        }
    }
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    if upgrade {
        // Take the listening sockets over from the running process (zero-downtime upgrade).
        server.bootstrap();
    }
    let listen = config.listen;
    let admin_listen = config.admin_listen.to_string();
    let drain = Duration::from_secs(config.shutdown.drain_seconds);
    let tls = config.tls.clone();
    let metrics = Arc::new(Metrics::new());
    let live = Arc::new(LivePolicy::new(config, metrics).map_err(|e| e.to_string())?);
    let health = Arc::new(Health::default());
    let gateway = Gateway::new(Arc::clone(&live), Arc::clone(&health), clock);
    let mut svc = http_proxy_service_with_name(&server.configuration, gateway, "tollgate");
    svc.add_tcp(&listen.to_string());
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

    let admin = Admin {
        live: Arc::clone(&live),
        health: Arc::clone(&health),
    };
    let mut admin_svc = Service::new("tollgate admin".into(), HttpServer::new_app(admin));
    admin_svc.add_tcp(&admin_listen);
    admin_svc.threads = Some(1);
    server.add_service(admin_svc);
    server.add_service(background_service(
        "tollgate reload on SIGHUP",
        ReloadOnHangup(Arc::clone(&live)),
    ));
    server.add_service(background_service(
        "tollgate readiness",
        ReadinessProbe {
            health: Arc::clone(&health),
            listen,
        },
    ));
    let signals = Signals {
        health: Arc::clone(&health),
        drain,
    };
    Ok(Built {
        server,
        live,
        signals,
    })
}

/// How log lines reach stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogWriter {
    /// A background thread takes the lines and writes them in batches (one `write` per batch,
    /// not per line), so a slow log sink never stalls a request. No line is dropped: past
    /// 128,000 queued lines, logging waits. Lines still queued are written at exit (not after
    /// a SIGKILL).
    Background,
    /// Each line written from the thread that logs it. For `--daemon`: the background thread
    /// would not survive Pingora's fork.
    Direct,
}

/// Keeps the background log writer running; drop it last (it writes what is queued).
pub struct LogGuard {
    _worker: Option<tracing_appender::non_blocking::WorkerGuard>,
}

/// Install the log subscriber. Pingora logs through the `log` crate, raw request bytes
/// included; no bridge from `log` is installed, so none of that can reach the output.
pub fn init_logging(format: LogFormat, writer: LogWriter) -> LogGuard {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("TOLLGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: journald, files and log shippers get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (make_writer, guard) = match writer {
        LogWriter::Background => {
            let (w, g) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                .lossy(false)
                .thread_name("tollgate-log")
                .finish(std::io::BufWriter::with_capacity(
                    64 * 1024,
                    std::io::stderr(),
                ));
            (
                tracing_subscriber::fmt::writer::BoxMakeWriter::new(w),
                Some(g),
            )
        }
        LogWriter::Direct => (
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
            None,
        ),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(make_writer);
    let _ = match format {
        LogFormat::Text => tracing::subscriber::set_global_default(builder.finish()),
        LogFormat::Json => tracing::subscriber::set_global_default(builder.json().finish()),
    };
    LogGuard { _worker: guard }
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
