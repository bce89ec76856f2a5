//! The edge: what runs before a request exists, and what bounds every connection.
//!
//! Pingora accepts a connection on a plain TCP listener and hands it to [`EdgeApp`], which:
//!
//! 1. admits it under the connection caps ([`conns`]), before any TLS or HTTP: a connection
//!    over `max_connections` or `max_connections_per_ip` is closed at once;
//! 2. on the TLS listener, runs the TLS handshake itself (Pingora's own listener would give it
//!    a fixed 60 s) within `tls_handshake_timeout`;
//! 3. wraps the stream in an [`EdgeStream`]: total deadlines on heads,
//!    bodies, idle keep-alive and stalled writes, and the head cap ([`stream`], [`h2scan`]);
//! 4. hands it to Pingora's HTTP proxy (or, on the admin listener, its HTTP server), whose
//!    HTTP/1.1 and HTTP/2 handling is unchanged; between HTTP/1.1 requests the connection
//!    waits holding only its stream ([`EdgeApp`]'s keep-alive loop).
//!
//! The admin listener goes through the same door with its own cap (`admin_max_connections`),
//! so no client can hold its resources either.
//!
//! This is the smallest hook that does the job: Pingora's `ServerApp` and stream types are
//! public, so nothing of Pingora is copied or changed.

pub(crate) mod conns;
pub(crate) mod fds;
pub(crate) mod h2scan;
pub(crate) mod stream;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::apps::{HttpPersistentSettings, HttpServerApp, ServerApp};
use pingora::listeners::tls::Acceptor;
use pingora::protocols::http::ServerSession;
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use prometheus::{IntCounter, IntGauge};

use crate::runtime::live::LivePolicy;
use conns::{Caps, ConnLimiter, Refused};
use fds::Descriptors;
use stream::EdgeStream;

/// The TLS listener: its port (the listeners are told apart by the local port) and acceptor.
pub(crate) struct TlsListener {
    pub port: u16,
    pub acceptor: Acceptor,
}

/// Which listeners an [`EdgeApp`] serves: the caps it admits under and how its connections
/// are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Listeners {
    /// The gateway's (`listen`, `tls.listen`): `max_connections`, `max_connections_per_ip`.
    Gateway,
    /// The admin listener (`admin_listen`): `admin_max_connections`.
    Admin,
}

/// A listener group's connections: admission, TLS, deadlines, then `A` (the HTTP proxy, or
/// the admin listener's HTTP server), with an HTTP/1.1 connection held lightly between
/// requests.
pub(crate) struct EdgeApp<A> {
    app: Arc<A>,
    live: Arc<LivePolicy>,
    listeners: Listeners,
    conns: Arc<ConnLimiter>,
    tls: Option<TlsListener>,
    /// `tollgate_connections{listener}`: `http` and `tls`, or `admin`.
    open: [IntGauge; 2],
    /// `tollgate_connections_refused_total{reason}`: `max_connections`,
    /// `max_connections_per_ip`, `no_descriptors`.
    refused: [IntCounter; 3],
    /// The gateway's: its descriptor budget ([`fds`]).
    fds: Option<Arc<Descriptors>>,
}

impl<A> EdgeApp<A> {
    /// The gateway's listeners, `tls` among them when configured.
    pub(crate) fn gateway(
        app: Arc<A>,
        live: Arc<LivePolicy>,
        tls: Option<TlsListener>,
        fds: Arc<Descriptors>,
    ) -> Self {
        let m = live.metrics();
        let open = [m.connections("http"), m.connections("tls")];
        Self {
            fds: Some(fds),
            ..Self::new(app, live, Listeners::Gateway, tls, open)
        }
    }

    /// The admin listener.
    pub(crate) fn admin(app: Arc<A>, live: Arc<LivePolicy>) -> Self {
        let admin = live.metrics().connections("admin");
        Self::new(app, live, Listeners::Admin, None, [admin.clone(), admin])
    }

    fn new(
        app: Arc<A>,
        live: Arc<LivePolicy>,
        listeners: Listeners,
        tls: Option<TlsListener>,
        open: [IntGauge; 2],
    ) -> Self {
        let m = live.metrics();
        Self {
            app,
            listeners,
            conns: ConnLimiter::new(),
            tls,
            open,
            refused: [
                m.connections_refused(conns::Refused::MaxConnections.as_str()),
                m.connections_refused(conns::Refused::MaxConnectionsPerIp.as_str()),
                m.connections_refused(conns::Refused::NoDescriptors.as_str()),
            ],
            fds: None,
            live,
        }
    }
}

fn peer_ip(stream: &Stream) -> Option<IpAddr> {
    match stream.get_socket_digest()?.peer_addr()? {
        PeerAddr::Inet(a) => Some(a.ip()),
        _ => None,
    }
}

fn local_port(stream: &Stream) -> Option<u16> {
    match stream.get_socket_digest()?.local_addr()? {
        PeerAddr::Inet(a) => Some(a.port()),
        _ => None,
    }
}

impl<A> EdgeApp<A> {
    /// A gateway connection: within the descriptor budget, then under the caps.
    fn admit_gateway(
        &self,
        fds: &Descriptors,
        stream: &Stream,
        peer: Option<IpAddr>,
        caps: Caps,
        limits: &crate::config::Server,
        gauge: &IntGauge,
    ) -> Result<conns::ConnGuard, Refused> {
        let fd = stream
            .as_any()
            .downcast_ref::<L4Stream>()
            .map(std::os::fd::AsRawFd::as_raw_fd);
        let open = self.conns.open();
        let admin = limits.admin_max_connections.get();
        if fd.is_some_and(|fd| fds.exhausted(fd, open, admin)) {
            fds.refused(open);
            return Err(Refused::NoDescriptors);
        }
        let guard = self.conns.admit(peer, caps, limits, gauge)?;
        fds.admitted();
        Ok(guard)
    }
}

impl<A: HttpServerApp + Send + Sync + 'static> EdgeApp<A> {
    /// HTTP/1.1, one request at a time: each exchange is Pingora's (`process_new_http`, whose
    /// state is dropped when it ends), and between exchanges the connection waits for the
    /// next request's first byte holding only its stream (no session, no head buffer, no
    /// future of the last exchange): an idle connection costs a fraction of what Pingora's own
    /// keep-alive loop holds (docs/security.md, "Memory per connection"). Pipelining stays off
    /// (Pingora answers the first request and closes), so no bytes are carried between
    /// exchanges but those the wait itself read, which the stream gives back first.
    async fn serve_http1(&self, mut stream: Stream, shutdown: &ShutdownWatch) {
        let mut persistent: Option<HttpPersistentSettings> = None;
        let mut stopping = shutdown.clone();
        loop {
            let mut session = ServerSession::new_http1(stream);
            match persistent.take() {
                Some(p) => p.apply_to_session(&mut session),
                None => {
                    // As Pingora's own loop starts a connection.
                    let shutting = *shutdown.borrow();
                    session.set_keepalive((!shutting).then_some(60));
                    session.set_keepalive_reuses_remaining(
                        self.app
                            .server_options()
                            .and_then(|o| o.keepalive_request_limit),
                    );
                }
            }
            let Some(reused) = self.app.process_new_http(session, shutdown).await else {
                return;
            };
            let (next, settings) = reused.consume();
            persistent = settings;
            let Ok(mut edge) = next.into_any().downcast::<EdgeStream>() else {
                return;
            };
            // As Pingora's own wait for a kept-alive request: a shutdown ends it.
            tokio::select! {
                biased;
                next = edge.wait_for_request() => if next.is_err() { return },
                _ = stopping.wait_for(|&stop| stop) => return,
            }
            stream = edge;
        }
    }
}

#[async_trait]
impl<A: HttpServerApp + Send + Sync + 'static> ServerApp for EdgeApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let accepted = Instant::now();
        // The settings this connection keeps for its life ([`stream::Conn`]).
        let limits = Arc::clone(&self.live.load().policy.config.server);
        let peer = peer_ip(&stream);
        let tls = self
            .tls
            .as_ref()
            .filter(|t| local_port(&stream) == Some(t.port));
        let gauge = &self.open[usize::from(tls.is_some())];
        let caps = match self.listeners {
            Listeners::Gateway => Caps::gateway(&limits),
            Listeners::Admin => Caps::admin(&limits),
        };
        let admitted = match &self.fds {
            Some(fds) => self.admit_gateway(fds, &stream, peer, caps, &limits, gauge),
            None => self.conns.admit(peer, caps, &limits, gauge),
        };
        let guard = match admitted {
            Ok(g) => g,
            Err(why) => {
                self.refused[why as usize].inc();
                tracing::debug!(target: "tollgate::edge", peer = ?peer, reason = why.as_str(), "connection refused");
                return None;
            }
        };
        let stream: Stream = match tls {
            None => stream,
            Some(t) => {
                // The listener is plain TCP: the stream is Pingora's own L4 stream.
                let l4 = stream.into_any().downcast::<L4Stream>().ok()?;
                // Boxed: held inline, the handshake's state would stay in this future (and in
                // every plain connection's memory) for the connection's life.
                let handshake = Box::pin(tokio::time::timeout(
                    limits.tls_handshake_timeout,
                    t.acceptor.tls_handshake(*l4),
                ));
                match handshake.await {
                    Ok(Ok(tls)) => Box::new(tls),
                    Ok(Err(e)) => {
                        tracing::debug!(target: "tollgate::edge", peer = ?peer, error = ?e.etype(), "TLS handshake failed");
                        return None;
                    }
                    Err(_) => {
                        tracing::debug!(target: "tollgate::edge", peer = ?peer, "TLS handshake timed out");
                        return None;
                    }
                }
            }
        };
        let edge = EdgeStream::new(stream, guard, accepted, limits);
        if edge.is_h2() {
            // HTTP/2: Pingora's own connection handling (its streams are tasks of their own).
            return self.app.process_new(Box::new(edge), shutdown).await;
        }
        self.serve_http1(Box::new(edge), shutdown).await;
        None
    }

    async fn cleanup(&self) {
        self.app.http_cleanup().await;
    }
}
