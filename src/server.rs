//! The roof: the Pingora server built from a [`Config`], for `run`, `demo` and the tests — the
//! gateway listener(s), the admin listener, and the background services of
//! [`crate::runtime::lifecycle`], the shared budgets, the key room and the trace exporter. This is the one place
//! where the rooms below (proxy, admin, edge, shared budgets, keys, the runtime's ground)
//! are wired together, and nothing imports from here but the commands.

use std::sync::Arc;
use std::time::Duration;

use pingora::apps::http_app::HttpServer;
use pingora::apps::HttpServerOptions;
use pingora::listeners::tls::{Acceptor, TlsSettings};
use pingora::listeners::{L4BufferSettings, ListenerConfig, DEFAULT_L4_WRITE_BUFFER_SIZE};
use pingora::prelude::Opt;
use pingora::protocols::http::v2::server::default_h2_options;
use pingora::server::configuration::ServerConf;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::Admin;
use crate::clock::Clock;
use crate::config::{Config, Runtime, Tls};
use crate::edge::fds::Descriptors;
use crate::edge::{EdgeApp, TlsListener};
use crate::keys::{put_kept_in_force, Keeping, KeyChanges, KeySync};
use crate::limit::{LocalStore, Store};
use crate::proxy::Gateway;
use crate::runtime::error::SetupError;
use crate::runtime::lifecycle::{BlockSweeper, Health, ReadinessProbe, ReloadOnHangup, Signals};
use crate::runtime::live::LivePolicy;
use crate::runtime::metrics::Metrics;
use crate::shared::BudgetSync;

/// Each connection's socket read buffer: none. Pingora's default is 64 KiB, held for the
/// connection's whole life, idle or not; Pingora's HTTP code reads heads into its own buffer
/// (made for each request and dropped with it) and bodies in pieces of its own, so the socket
/// is read straight into those (docs/security.md, "Memory per connection").
pub const L4_READ_BUFFER: usize = 0;

/// The TLS listener's acceptor: the certificate chain and key, HTTP/1.1 and HTTP/2 by ALPN.
fn tls_acceptor(t: &Tls) -> Result<Acceptor, SetupError> {
    let (cert, key) = (
        t.cert_file.to_string_lossy().into_owned(),
        t.key_file.to_string_lossy().into_owned(),
    );
    match pingora::tls::load_certs_and_key_files(&cert, &key) {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(SetupError::Tls(format!(
                "no certificate in {cert} or no private key in {key}"
            )))
        }
        Err(e) => {
            return Err(SetupError::Tls(format!(
                "cannot load {cert} / {key}: {:?}",
                e.etype()
            )))
        }
    }
    let mut settings = TlsSettings::intermediate(&cert, &key)
        .map_err(|e| SetupError::Tls(format!("{:?}", e.etype())))?;
    settings.enable_h2();
    Ok(settings.build())
}

/// Pingora's server settings when no `--conf` file is given: the config's `runtime` block
/// (its threads, scheduler, upstream pool and accept loops; docs/benchmarks.md says how each
/// default was chosen).
pub fn server_conf(runtime: &Runtime) -> ServerConf {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    ServerConf {
        threads: runtime.threads_for(cpus),
        work_stealing: runtime.stealing_for(cpus),
        upstream_keepalive_pool_size: runtime.upstream_keepalive_pool_size,
        listener_tasks_per_fd: runtime.listener_tasks_per_fd,
        ..ServerConf::default()
    }
}

/// [`server_conf`] of the `runtime` block's defaults.
pub fn default_server_conf() -> ServerConf {
    server_conf(&Runtime::default())
}

/// A server ready to run, and the handles the caller may need.
pub struct Built {
    pub server: Server,
    pub live: Arc<LivePolicy>,
    /// The signal handling of [`crate::runtime::lifecycle`], for `Server::run`.
    pub signals: Signals,
}

impl Built {
    /// Serve until a signal ends the process (see [`crate::runtime::lifecycle`]).
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
pub fn build(config: Config, clock: Arc<dyn Clock>, opt: Option<Opt>) -> Result<Built, SetupError> {
    let mut server = pingora_server(&config, opt)?;
    let listen = config.process.listen;
    let admin_listen = config.process.admin_listen.to_string();
    let drain = Duration::from_secs(config.process.shutdown.drain_seconds);
    let tls = config.process.tls.clone();
    let rooms = Rooms::open(config, &clock)?;
    let health = Arc::new(Health::default());
    add_gateway(&mut server, &rooms, &health, &clock, tls)?;
    let admin_failures = Arc::new(crate::policy::blocking::FailureTable::new());
    add_admin(
        &mut server,
        &rooms,
        &health,
        &clock,
        &admin_failures,
        admin_listen,
    );
    let live = Arc::clone(&rooms.live);
    add_background(&mut server, rooms, &health, clock, admin_failures, listen);
    let signals = Signals { health, drain };
    Ok(Built {
        server,
        live,
        signals,
    })
}

/// The Pingora server: its settings (a `--conf` file, else the `runtime:` block) with the
/// config's shutdown times; every listen address checked first, unless `--upgrade` takes the
/// sockets over from the running process.
fn pingora_server(config: &Config, opt: Option<Opt>) -> Result<Server, SetupError> {
    let mut conf = match opt.as_ref().filter(|o| o.conf.is_some()) {
        Some(o) => ServerConf::load_yaml_with_opt_override(o)
            .map_err(|e| SetupError::PingoraConf(e.to_string()))?,
        None => server_conf(&config.process.runtime),
    };
    conf.grace_period_seconds = Some(config.process.shutdown.grace_seconds);
    conf.graceful_shutdown_timeout_seconds = Some(config.process.shutdown.timeout_seconds);
    let upgrade = opt.as_ref().is_some_and(|o| o.upgrade);
    if !upgrade {
        let mut addrs = vec![
            ("listen", config.process.listen),
            ("admin_listen", config.process.admin_listen),
        ];
        addrs.extend(
            config
                .process
                .tls
                .as_ref()
                .map(|t| ("tls.listen", t.listen)),
        );
        for (field, addr) in addrs {
            std::net::TcpListener::bind(addr).map_err(|source| SetupError::Listen {
                file: config.source.clone(),
                field,
                addr,
                source,
            })?;
        }
    }
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    if upgrade {
        // Take the listening sockets over from the running process (zero-downtime upgrade).
        server.bootstrap();
    }
    Ok(server)
}

/// The rooms that hold state, opened and wired: the shared budgets (with `cluster`), the
/// owner of the changes to keys, the policy in force, the quota and ledger keeper.
struct Rooms {
    cluster: Option<(Arc<crate::limit::SharedStore>, Arc<BudgetSync>)>,
    changes: Arc<KeyChanges>,
    live: Arc<LivePolicy>,
    keeper: Arc<crate::ledger::Keeper>,
    sync_every: Option<Duration>,
}

impl Rooms {
    fn open(config: Config, clock: &Arc<dyn Clock>) -> Result<Self, SetupError> {
        let metrics = Arc::new(Metrics::new());
        let cluster = config.process.cluster.clone().map(|c| {
            let window = Duration::from_secs(u64::from(config.limits.window.get()));
            BudgetSync::new(c, window, Arc::clone(clock), &metrics)
        });
        let store: Arc<dyn Store> = match &cluster {
            Some((shared, _)) => Arc::clone(shared) as Arc<dyn Store>,
            None => Arc::new(LocalStore),
        };
        let started = std::time::Instant::now();
        let state_error =
            |file: &std::path::Path, e: crate::state::disk::DiskError| SetupError::State {
                file: file.to_path_buf(),
                message: e.to_string(),
            };
        let (keeping, kept) = Keeping::open(
            config.process.cluster.as_ref(),
            config.process.state_path.as_deref(),
        )
        .map_err(|e| state_error(&config.source, e))?;
        let source = config.source.clone();
        let rows = kept.rows().map_err(|e| state_error(&source, e))?;
        let sync_every = config.process.cluster.as_ref().map(|c| c.sync_interval);
        let (live, read) = read_kept_beside(&kept, |batches| {
            let m = Arc::clone(&metrics);
            LivePolicy::with_store(config, metrics, store, |policy| {
                put_kept_in_force(policy, batches, rows, &m)
            })
        });
        let read_took = read.map_err(|e| state_error(&source, e))?;
        let (live, in_force) = live?;
        let live = Arc::new(live);
        if rows > 0 {
            let ms = |d: Duration| d.as_millis() as u64;
            tracing::info!(
                target: "tollgate::overrides",
                records = rows,
                read_ms = ms(read_took),
                in_force_ms = ms(started.elapsed()),
                "the changes kept at state.path put in force"
            );
        }
        let changes = KeyChanges::new(keeping, Arc::clone(&live), in_force);
        let keeper = Arc::new(
            crate::ledger::Keeper::open(changes.state_file(), Arc::clone(&live)).map_err(|e| {
                SetupError::State {
                    file: live.path().to_path_buf(),
                    message: e.to_string(),
                }
            })?,
        );
        if let Some((_, sync)) = &cluster {
            sync.carry(Arc::clone(&keeper) as Arc<dyn crate::shared::Rider>);
        }
        Ok(Self {
            cluster,
            changes,
            live,
            keeper,
            sync_every,
        })
    }
}

/// Make the policy in force with `make`, which puts in force the batches of records it is
/// handed as they come, while a thread of its own reads them from `kept`: reading a million
/// records and putting them in force take about as long each (docs/keyscale.md), and a
/// start takes the longer of the two, not their sum. What `make` made, and how long the
/// read took, or why it failed (a read that failed half-way left `make` the records before:
/// the caller refuses to start).
fn read_kept_beside<T>(
    kept: &crate::keys::Kept,
    make: impl FnOnce(std::sync::mpsc::IntoIter<Batch>) -> T,
) -> (T, Result<Duration, crate::state::disk::DiskError>) {
    crate::state::read_beside(
        |hand| {
            let started = std::time::Instant::now();
            // Stops when `make` no longer takes batches (it failed: the config).
            kept.read(hand).map(|()| started.elapsed())
        },
        make,
    )
}

/// A batch of the records kept, as read.
type Batch = Vec<(crate::digest::Digest, crate::policy::overrides::KeyRecord)>;

/// The gateway's service: the proxy behind the edge, on `listen` and the TLS listener.
fn add_gateway(
    server: &mut Server,
    rooms: &Rooms,
    health: &Arc<Health>,
    clock: &Arc<dyn Clock>,
    tls: Option<Tls>,
) -> Result<(), SetupError> {
    let live = &rooms.live;
    let edge_limits = live.load().policy.config.server.clone();
    let mut gateway = Gateway::new(
        Arc::clone(&rooms.changes),
        Arc::clone(health),
        Arc::clone(clock),
    );
    if let Some((_, sync)) = &rooms.cluster {
        gateway = gateway.with_settling(sync.settling());
    }
    if let Some(t) = &live.load().policy.config.process.tracing {
        let tracer = crate::traces::Tracer::start(t, live.metrics()).map_err(SetupError::Traces)?;
        gateway = gateway.with_traces(Arc::new(tracer));
    }
    let mut proxy = pingora::proxy::http_proxy(&server.configuration, gateway);
    let mut options = HttpServerOptions::default();
    // An HTTP/2 connection with no open stream closes after the idle timeout (HTTP/1.1 idle
    // connections are closed by the edge stream).
    options.h2_idle_timeout = Some(edge_limits.idle_timeout);
    proxy.server_options = Some(options);
    let mut h2 = default_h2_options();
    let ceiling = crate::edge::h2scan::header_ceiling(&edge_limits);
    h2.max_header_list_size(u32::try_from(ceiling).unwrap_or(u32::MAX));
    proxy.h2_options = Some(h2);
    let tls_listener = match &tls {
        None => None,
        Some(t) => Some(TlsListener {
            port: t.listen.port(),
            acceptor: tls_acceptor(t)?,
        }),
    };
    // The soft descriptor limit raised to the hard one, and the gateway's budget under it.
    let fds = Arc::new(Descriptors::new(crate::edge::fds::raise_limit()));
    let edge = EdgeApp::gateway(Arc::new(proxy), Arc::clone(live), tls_listener, fds);
    let mut svc = Service::new("tollgate".into(), edge);
    let buffers = L4BufferSettings::new(L4_READ_BUFFER, DEFAULT_L4_WRITE_BUFFER_SIZE);
    let listen = live.load().policy.config.process.listen;
    svc.add_listener(ListenerConfig::tcp(listen.to_string()).l4_buffer(buffers));
    if let Some(t) = &tls {
        svc.add_listener(ListenerConfig::tcp(t.listen.to_string()).l4_buffer(buffers));
    }
    server.add_service(svc);
    Ok(())
}

/// The admin listener's service, on `admin_listen`, one thread.
fn add_admin(
    server: &mut Server,
    rooms: &Rooms,
    health: &Arc<Health>,
    clock: &Arc<dyn Clock>,
    failures: &Arc<crate::policy::blocking::FailureTable>,
    admin_listen: String,
) {
    let admin = Admin {
        live: Arc::clone(&rooms.live),
        health: Arc::clone(health),
        cluster: rooms.cluster.as_ref().map(|(s, _)| Arc::clone(s)),
        clock: Arc::clone(clock),
        failures: Arc::clone(failures),
        changes: Arc::clone(&rooms.changes),
        ledger: Arc::clone(&rooms.keeper),
        names: Default::default(),
    };
    let admin = EdgeApp::admin(
        Arc::new(HttpServer::new_app(admin)),
        Arc::clone(&rooms.live),
    );
    let mut svc = Service::new("tollgate admin".into(), admin);
    let buffers = L4BufferSettings::new(L4_READ_BUFFER, DEFAULT_L4_WRITE_BUFFER_SIZE);
    svc.add_listener(ListenerConfig::tcp(admin_listen).l4_buffer(buffers));
    svc.threads = Some(1);
    server.add_service(svc);
}

/// The background services: SIGHUP's reload, the auth-failure sweeper, key expiry, the
/// keeper, the shared budgets' and the key changes' sync (with `cluster`), readiness.
fn add_background(
    server: &mut Server,
    rooms: Rooms,
    health: &Arc<Health>,
    clock: Arc<dyn Clock>,
    admin_failures: Arc<crate::policy::blocking::FailureTable>,
    listen: std::net::SocketAddr,
) {
    let live = &rooms.live;
    server.add_service(background_service(
        "tollgate reload on SIGHUP",
        ReloadOnHangup(Arc::clone(live)),
    ));
    server.add_service(background_service(
        "tollgate auth-failure sweeper",
        BlockSweeper {
            live: Arc::clone(live),
            clock,
            admin_failures,
        },
    ));
    server.add_service(background_service(
        "tollgate key expiry",
        crate::runtime::lifecycle::Expiry {
            live: Arc::clone(live),
        },
    ));
    server.add_service(background_service(
        "tollgate quota and ledger keeper",
        crate::ledger::KeeperTick(Arc::clone(&rooms.keeper)),
    ));
    if let Some((_, svc)) = rooms.cluster {
        server.add_service(pingora::services::background::GenBackgroundService::new(
            "tollgate cluster sync".into(),
            svc,
        ));
    }
    if let (Some(every), true) = (rooms.sync_every, rooms.changes.shared()) {
        // A replica that keeps no copy of its own knows the fleet's changes (revocations
        // among them) only once it has read them: not ready before.
        let awaiting_first_read = rooms.changes.state_file().is_none();
        if awaiting_first_read {
            health.awaiting_first_read();
        }
        server.add_service(background_service(
            "tollgate key changes sync",
            KeySync {
                changes: Arc::clone(&rooms.changes),
                every,
                first_read: awaiting_first_read.then(|| Arc::clone(health)),
                copying: Default::default(),
            },
        ));
    }
    server.add_service(background_service(
        "tollgate readiness",
        ReadinessProbe {
            health: Arc::clone(health),
            listen,
        },
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;
    use crate::policy::overrides::KeyRecord;
    use crate::state::{disk, StateFile};

    /// A start is handed every record kept, in the order of their digests, in batches (each
    /// put in force while the next is read); a start that stops taking them (its config
    /// failed) stops the reader, and returns.
    #[test]
    fn a_start_is_handed_every_record_kept_in_order_and_the_reader_stops_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let n = disk::BATCH * 2 + 5;
        let records: Vec<(Digest, Option<KeyRecord>)> = (0..n)
            .map(|i| {
                let name = format!("k{i}");
                (Digest::of(name.as_bytes()), Some(KeyRecord::named(&name)))
            })
            .collect();
        StateFile::open(&path)
            .unwrap()
            .write(|db| disk::write_all(db, &records))
            .unwrap();
        let (_, kept) = Keeping::open(None, Some(&path)).unwrap();
        let rows = kept.rows().unwrap();
        assert_eq!(rows, n);

        let (batches, read) = read_kept_beside(&kept, |b| b.collect::<Vec<_>>());
        read.unwrap();
        assert!(batches
            .iter()
            .all(|b| !b.is_empty() && b.len() <= disk::BATCH));
        let got: Vec<(Digest, KeyRecord)> = batches.into_iter().flatten().collect();
        let mut want: Vec<(Digest, KeyRecord)> =
            records.into_iter().map(|(d, o)| (d, o.unwrap())).collect();
        want.sort_by_key(|r| r.0);
        assert_eq!(got, want);

        // One batch taken, then no more: the reader stops at its next batch.
        let (first, read) = read_kept_beside(&kept, |mut b| b.next().map(|b| b.len()));
        read.unwrap();
        assert_eq!(first, Some(disk::BATCH));

        // Nothing kept: handed nothing, at once.
        let (_, none) = Keeping::open(None, None).unwrap();
        let (count, read) = read_kept_beside(&none, |b| b.count());
        read.unwrap();
        assert_eq!(count, 0);
    }
}
