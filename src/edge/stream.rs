//! The accepted stream, wrapped: total deadlines on reads and writes, and the connection's
//! place under the caps.
//!
//! Pingora's own read timeouts restart at every read, and none applies between requests on a
//! kept-alive HTTP/1.1 connection or to an HTTP/2 request; a client can hold a connection by
//! sending one byte every minute. [`EdgeStream`] sits between the socket (or the TLS session)
//! and Pingora's HTTP code and enforces *totals*:
//!
//! | phase (HTTP/1.1) | a read fails after | begins |
//! |---|---|---|
//! | head | `header_timeout` | the connection opens; or the first byte after an idle spell |
//! | body | `body_timeout` | the head is complete and a body follows ([`Conn::head_done`]) |
//! | open | — | the body is complete ([`Conn::body_done`]): the answer is being made |
//! | idle | `idle_timeout` | the exchange is over ([`Conn::exchange_done`]) |
//!
//! The request path tells the stream where an HTTP/1.1 exchange is, through the [`Conn`] it
//! shares with it. An HTTP/2 connection carries many exchanges at once, so its deadlines come
//! from the client's frames instead ([`super::h2scan`]). On both, a write that makes no
//! progress for `send_timeout` fails: a client that stops reading its answer is dropped.
//! While a head is being read, bytes past twice `max_header_bytes` (plus a buffer's worth)
//! end the connection, so Pingora never buffers its own 1 MiB head limit; the exact check
//! (431) is the request path's.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::SslDigest;
use pingora::protocols::tls::TlsRef;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::time::fast_timeout::fast_sleep;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::conns::ConnGuard;
use super::h2scan::{H2Limits, H2Out, H2Scan};
use crate::clock::Nanos;
use crate::config::Server;

const HEAD: u8 = 0;
const BODY: u8 = 1;
const OPEN: u8 = 2;
const IDLE: u8 = 3;
/// No deadline.
const NONE: u64 = u64::MAX;
/// On HTTP/2, how much after the body deadline the connection itself is ended: time for the
/// request path's own deadline on a checked body to answer 408 first.
const H2_BODY_GRACE: Duration = Duration::from_millis(250);
/// Pingora may read this much past a head in one go (its socket buffer): allowed before the
/// head cap ends the connection.
const HEAD_SLACK: usize = 64 * 1024;

/// One connection's state, shared by its stream and (HTTP/1.1) the requests on it.
///
/// A connection keeps the `server:` settings in force when it was accepted, for its life: its
/// stream's deadlines and caps and, on HTTP/1.1, what the request path reads of them for
/// every request on it (header caps, trusted proxies, the checked-body deadline, requests per
/// connection). A reload applies to connections accepted after it; a kept-alive connection
/// never runs two versions at once.
#[derive(Debug)]
pub(crate) struct Conn {
    accepted: Instant,
    settings: Arc<Server>,
    phase: AtomicU8,
    /// ns since `accepted`; [`NONE`] for none.
    deadline: AtomicU64,
    /// Bytes read in the current head phase.
    head_bytes: AtomicUsize,
    /// Requests begun on this connection.
    requests: AtomicU32,
    /// Set when a deadline ended the connection.
    timed_out: AtomicBool,
}

impl Conn {
    fn new(accepted: Instant, settings: Arc<Server>) -> Self {
        Self {
            accepted,
            phase: AtomicU8::new(HEAD),
            deadline: AtomicU64::new(settings.header_timeout.as_nanos() as u64),
            settings,
            head_bytes: AtomicUsize::new(0),
            requests: AtomicU32::new(0),
            timed_out: AtomicBool::new(false),
        }
    }

    fn now(&self) -> Nanos {
        self.accepted.elapsed().as_nanos() as Nanos
    }

    fn enter(&self, phase: u8, deadline: u64) {
        self.phase.store(phase, Ordering::Relaxed);
        self.deadline.store(deadline, Ordering::Relaxed);
    }

    /// ns since the connection opened, at `at`.
    fn at(&self, at: Instant) -> Nanos {
        at.saturating_duration_since(self.accepted).as_nanos() as Nanos
    }

    /// The head of a request was complete at `at` (the request path's own reading of the
    /// clock): its body, if one follows, is due within `body_timeout` of then. Returns the
    /// number of this request on the connection.
    pub(crate) fn head_done(&self, at: Instant, body_follows: bool) -> u32 {
        self.head_bytes.store(0, Ordering::Relaxed);
        if body_follows {
            self.enter(
                BODY,
                self.at(at) + self.settings.body_timeout.as_nanos() as u64,
            );
        } else {
            self.enter(OPEN, NONE);
        }
        self.requests.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The request body is complete.
    pub(crate) fn body_done(&self) {
        if self.phase.load(Ordering::Relaxed) == BODY {
            self.enter(OPEN, NONE);
        }
    }

    /// The exchange was over at `at`: the connection is idle until the next request's first
    /// byte.
    pub(crate) fn exchange_done(&self, at: Instant) {
        self.enter(
            IDLE,
            self.at(at) + self.settings.idle_timeout.as_nanos() as u64,
        );
    }

    /// The `server:` settings the connection was accepted under (see the type's docs).
    pub(crate) fn settings(&self) -> &Server {
        &self.settings
    }

    /// Whether a deadline ended this connection.
    pub(crate) fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Relaxed)
    }
}

/// A timer for a deadline that moves with every exchange.
///
/// Setting a timer costs more than a request's own work, so this one is set lazily: only when
/// a read or write is about to wait, and moved only when the deadline comes *earlier* than it
/// is set for. Set for an earlier instant than the deadline in force, it fires, finds the
/// deadline not passed, and is set again: once per idle spell, not once per request. It is
/// Pingora's own timer (a shared clock thread, 10 ms ticks), not one in the runtime's wheel.
struct Timer {
    /// The sleep in progress; a `Mutex` only to make the stream `Sync` (it is reached through
    /// `&mut`, so never locked).
    sleep: Mutex<Option<Pin<Box<dyn Future<Output = ()> + Send>>>>,
    /// What the sleep is set for, in ns since the connection opened.
    armed: u64,
}

impl Timer {
    fn new() -> Self {
        Self {
            sleep: Mutex::new(None),
            armed: NONE,
        }
    }

    /// Whether `deadline` (ns since the connection opened, or [`NONE`]) has passed; if not,
    /// the task is woken when it does.
    fn expired(&mut self, cx: &mut Context<'_>, conn: &Conn, deadline: u64) -> bool {
        if deadline == NONE {
            return false;
        }
        let slot = self.sleep.get_mut().unwrap_or_else(|p| p.into_inner());
        loop {
            if slot.is_none() || self.armed > deadline {
                let now = conn.now();
                if now >= deadline {
                    return true;
                }
                *slot = Some(Box::pin(fast_sleep(Duration::from_nanos(deadline - now))));
                self.armed = deadline;
            }
            let fired = slot
                .as_mut()
                .is_some_and(|s| s.as_mut().poll(cx).is_ready());
            if !fired {
                return false;
            }
            *slot = None;
            if self.armed >= deadline {
                return true;
            }
            // It was set for an earlier deadline than the one in force: set it again.
        }
    }
}

/// How an HTTP/2 connection's deadlines are known.
struct H2 {
    scan: H2Scan,
    /// The server's frames as they are written: a stream it resets owes no body.
    out: H2Out,
    limits: H2Limits,
}

/// Bytes read at most while a kept-alive connection waits for its next request: a typical
/// head whole (the rest comes by the reads that follow).
pub(crate) const WAIT_READ: usize = 2048;

/// The stream Pingora's HTTP code reads and writes; see the module comment.
pub(crate) struct EdgeStream {
    inner: Stream,
    conn: Arc<Conn>,
    read_timer: Timer,
    write_timer: Timer,
    /// When the current stall of writes began to count, ns since `accepted`.
    write_deadline: u64,
    h2: Option<Box<H2>>,
    /// The start of the next request, read while the connection waited for it
    /// ([`EdgeStream::wait_for_request`]), from `pending_at` on; given back before anything
    /// else. Its capacity stays with the connection (at most [`WAIT_READ`] bytes).
    pending: Vec<u8>,
    pending_at: usize,
    _guard: ConnGuard,
}

impl fmt::Debug for EdgeStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EdgeStream")
            .field("inner", &self.inner)
            .field("conn", &self.conn)
            .finish()
    }
}

fn timed_out(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what)
}

impl EdgeStream {
    /// Wrap `inner`, a connection accepted at `accepted` under `settings` and admitted with
    /// `guard`.
    pub(crate) fn new(
        inner: Stream,
        guard: ConnGuard,
        accepted: Instant,
        settings: Arc<Server>,
    ) -> Self {
        let h2 = matches!(inner.selected_alpn_proto(), Some(ALPN::H2)).then(|| {
            Box::new(H2 {
                scan: H2Scan::new(),
                out: H2Out::default(),
                limits: H2Limits {
                    header_timeout: settings.header_timeout.as_nanos() as u64,
                    // A checked body's own deadline (408, answered by the request path)
                    // comes first; the connection is ended only if that did not settle it.
                    body_timeout: (settings.body_timeout + H2_BODY_GRACE).as_nanos() as u64,
                    max_block_bytes: super::h2scan::header_ceiling(&settings),
                },
            })
        });
        Self {
            inner,
            conn: Arc::new(Conn::new(accepted, settings)),
            read_timer: Timer::new(),
            write_timer: Timer::new(),
            write_deadline: NONE,
            h2,
            pending: Vec::new(),
            pending_at: 0,
            _guard: guard,
        }
    }

    /// Whether the connection speaks HTTP/2 (by ALPN).
    pub(crate) fn is_h2(&self) -> bool {
        self.h2.is_some()
    }

    /// Wait for the start of the next request on a kept-alive HTTP/1.1 connection, within
    /// the idle deadline: what arrives (up to [`WAIT_READ`] bytes, usually the whole head) is
    /// read, kept and given back first, and the request's head is due `header_timeout` after
    /// its first byte. One read, as without the wait (it once read one byte, then the rest: a
    /// system call more per request). An error: the client closed the connection, or the
    /// idle deadline passed.
    pub(crate) async fn wait_for_request(&mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_wait(cx)).await
    }

    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending_at < self.pending.len() {
            return Poll::Ready(Ok(()));
        }
        let mut chunk = [0u8; WAIT_READ];
        let mut buf = ReadBuf::new(&mut chunk);
        match Pin::new(&mut *self.inner).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the client closed the connection",
            ))),
            Poll::Ready(Ok(())) => {
                let read = buf.filled();
                self.on_read(read)?;
                self.pending.clear();
                self.pending.extend_from_slice(read);
                self.pending_at = 0;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if self.read_expired(cx) => {
                Poll::Ready(Err(timed_out("a deadline of the edge passed")))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// The connection's shared state.
    pub(crate) fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// The connection of an HTTP/1.1 session's stream, if it is an edge stream.
    pub(crate) fn of(stream: &Stream) -> Option<&Arc<Conn>> {
        stream
            .as_any()
            .downcast_ref::<EdgeStream>()
            .map(EdgeStream::conn)
    }

    /// Follow `read` bytes: phase changes and the head cap (HTTP/1.1), or the frames (HTTP/2).
    fn on_read(&mut self, read: &[u8]) -> io::Result<()> {
        let conn = &*self.conn;
        if let Some(h2) = self.h2.as_mut() {
            h2.scan
                .feed(read, conn.now(), &h2.limits)
                .map_err(|what| io::Error::new(io::ErrorKind::InvalidData, what))?;
            return Ok(());
        }
        match conn.phase.load(Ordering::Relaxed) {
            IDLE => {
                conn.enter(
                    HEAD,
                    conn.now() + conn.settings.header_timeout.as_nanos() as u64,
                );
                conn.head_bytes.store(read.len(), Ordering::Relaxed);
            }
            HEAD => {
                let n = conn.head_bytes.fetch_add(read.len(), Ordering::Relaxed) + read.len();
                if n > 2 * conn.settings.max_header_bytes + HEAD_SLACK {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "request head over server.max_header_bytes",
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The read deadline in force.
    fn read_deadline(&self) -> u64 {
        match &self.h2 {
            Some(h2) => h2.scan.deadline(&h2.limits).unwrap_or(NONE),
            None => self.conn.deadline.load(Ordering::Relaxed),
        }
    }

    fn read_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = self.read_deadline();
        let expired = self.read_timer.expired(cx, &self.conn, deadline);
        if expired {
            self.conn.timed_out.store(true, Ordering::Relaxed);
        }
        expired
    }

    /// Bytes written to the client (HTTP/2: the server's frames are followed, and a stream
    /// the server reset owes no body any more).
    fn on_write(&mut self, written: &[&[u8]]) {
        if let Some(h2) = self.h2.as_mut() {
            let H2 { scan, out, .. } = &mut **h2;
            for bytes in written {
                out.feed(bytes, |stream| scan.server_reset(stream));
            }
        }
    }

    /// After a write poll: progress clears the send deadline; a stall starts it, and fails
    /// once it passes.
    fn after_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => {
                if self.write_deadline == NONE {
                    self.write_deadline =
                        self.conn.now() + self.conn.settings.send_timeout.as_nanos() as u64;
                }
                if self
                    .write_timer
                    .expired(cx, &self.conn, self.write_deadline)
                {
                    self.conn.timed_out.store(true, Ordering::Relaxed);
                    return Poll::Ready(Err(timed_out(
                        "the client took no byte within server.send_timeout_seconds",
                    )));
                }
                Poll::Pending
            }
            ready => {
                self.write_deadline = NONE;
                ready
            }
        }
    }
}

impl AsyncRead for EdgeStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pending_at < this.pending.len() {
            // What the wait read (already followed by `on_read`), as much as fits; the
            // caller reads again for more (from the socket once this is all given back).
            let give = (this.pending.len() - this.pending_at).min(buf.remaining());
            buf.put_slice(&this.pending[this.pending_at..this.pending_at + give]);
            this.pending_at += give;
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut *this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                // Deadlines are checked when a read waits: a client that keeps the reads busy
                // is sending, and the head cap bounds what a head may send.
                let read = &buf.filled()[before..];
                if !read.is_empty() {
                    this.on_read(read)?;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if this.read_expired(cx) {
                    Poll::Ready(Err(timed_out("a deadline of the edge passed")))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl AsyncWrite for EdgeStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut *this.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &r {
            this.on_write(&[&data[..*n]]);
        }
        this.after_write(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut *this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &r {
            // The first `n` bytes of the buffers, in order.
            let mut left = *n;
            let mut written: Vec<&[u8]> = Vec::new();
            for b in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(b.len());
                written.push(&b[..take]);
                left -= take;
            }
            this.on_write(&written);
        }
        this.after_write(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut *this.inner).poll_flush(cx);
        this.after_write(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let r = Pin::new(&mut *this.inner).poll_shutdown(cx);
        this.after_write(cx, r)
    }
}

#[async_trait]
impl Shutdown for EdgeStream {
    async fn shutdown(&mut self) {
        // Bounded like any write: a client that takes nothing cannot hold the shutdown.
        let send = self.conn.settings.send_timeout;
        let _ = tokio::time::timeout(send, self.inner.shutdown()).await;
    }
}

impl UniqueID for EdgeStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for EdgeStream {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for EdgeStream {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for EdgeStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for EdgeStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for EdgeStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
