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
//! 4. hands it to Pingora's HTTP proxy, whose HTTP/1.1 and HTTP/2 handling is unchanged.
//!
//! This is the smallest hook that does the job: Pingora's `ServerApp` and stream types are
//! public, so nothing of Pingora is copied or changed.

pub mod conns;
pub mod h2scan;
pub mod stream;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::listeners::tls::Acceptor;
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;
use pingora::server::ShutdownWatch;
use prometheus::{IntCounter, IntGauge};

use crate::runtime::live::LivePolicy;
use conns::ConnLimiter;
use stream::{Deadlines, EdgeStream};

/// The TLS listener: its port (the listeners are told apart by the local port) and acceptor.
pub struct TlsListener {
    pub port: u16,
    pub acceptor: Acceptor,
}

/// The gateway listeners' connections: admission, TLS, deadlines, then `A` (the HTTP proxy).
pub struct EdgeApp<A> {
    proxy: Arc<A>,
    live: Arc<LivePolicy>,
    conns: Arc<ConnLimiter>,
    tls: Option<TlsListener>,
    /// `tollgate_connections{listener}`: `http`, `tls`.
    open: [IntGauge; 2],
    /// `tollgate_connections_refused_total{reason}`: `max_connections`, `max_connections_per_ip`.
    refused: [IntCounter; 2],
}

impl<A> EdgeApp<A> {
    pub fn new(proxy: Arc<A>, live: Arc<LivePolicy>, tls: Option<TlsListener>) -> Self {
        let m = live.metrics();
        Self {
            proxy,
            conns: ConnLimiter::new(),
            tls,
            open: [m.connections("http"), m.connections("tls")],
            refused: [
                m.connections_refused(conns::Refused::MaxConnections.as_str()),
                m.connections_refused(conns::Refused::MaxConnectionsPerIp.as_str()),
            ],
            live,
        }
    }

    /// The connections open now, all listeners.
    pub fn conns(&self) -> &Arc<ConnLimiter> {
        &self.conns
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

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for EdgeApp<A> {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let accepted = Instant::now();
        let limits = self.live.load().policy.config.server.clone();
        let peer = peer_ip(&stream);
        let tls = self
            .tls
            .as_ref()
            .filter(|t| local_port(&stream) == Some(t.port));
        let gauge = &self.open[usize::from(tls.is_some())];
        let guard = match self.conns.admit(peer, &limits, gauge) {
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
        let edge = EdgeStream::new(stream, guard, accepted, Deadlines::of(&limits));
        self.proxy.process_new(Box::new(edge), shutdown).await
    }

    async fn cleanup(&self) {
        self.proxy.cleanup().await;
    }
}
