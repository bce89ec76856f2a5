//! Logging: `tracing` to stderr, as text or JSON, written by a background thread; the access
//! line written without `tracing`.
//!
//! Pingora logs through the `log` crate, raw request bytes (bearer keys included) among them;
//! no bridge from `log` is installed, so none of that can reach the output.
//!
//! Every line, the access line and `tracing`'s alike, goes through one [`Sink`]: loggers append
//! the line's bytes to a queue under a lock (a copy, no allocation once the queue has grown),
//! and a writer thread, woken by a batch's first line, lets the batch gather for up to
//! [`BATCH_WAIT`], swaps the queue for its spare buffer and writes the batch with one
//! `write`. A line is never dropped: past [`QUEUE_CAP`] bytes queued, loggers wait for the
//! writer. The access line ([`AccessLine`], one per request) skips `tracing` altogether: it is
//! formatted by hand into a reused per-thread buffer, in the same text or JSON layout
//! `tracing-subscriber` gives every other line (the tests hold the two to the same bytes).

use std::cell::RefCell;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::LogFormat;
use crate::sync::Locked;

/// How log lines reach stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogWriter {
    /// A background thread takes the lines and writes them in batches (one `write` per batch,
    /// not per line; a line waits [`BATCH_WAIT`] at most), so a slow log sink never stalls a
    /// request. No line is dropped: past [`QUEUE_CAP`] bytes queued, logging waits. Lines
    /// still queued are written at exit (not after a SIGKILL).
    Background,
    /// Each line written from the thread that logs it. For `--daemon`: the background thread
    /// would not survive Pingora's fork.
    Direct,
}

/// Bytes queued for the writer thread at most (some 40,000 access lines); a logger that
/// would pass it waits until the writer has taken the queue.
pub const QUEUE_CAP: usize = 8 << 20;

/// The capacity the writer's buffers go back to after a burst made them larger.
const BATCH_KEEP: usize = 256 << 10;

/// How long the writer lets lines gather after the first of a batch, unless [`BATCH_FULL`]
/// come first: a line reaches stderr within this (or at exit).
pub const BATCH_WAIT: Duration = Duration::from_millis(50);

/// Bytes queued that start a write at once (a logger that crosses it wakes the writer).
pub const BATCH_FULL: usize = 128 << 10;

/// Where every line goes: a queue the writer thread drains, or stderr directly.
pub struct Sink {
    /// Bytes queued at most ([`QUEUE_CAP`]; less in the tests).
    cap: usize,
    /// Lines are written by the thread that logs them (`--daemon`, or no writer thread).
    direct: AtomicBool,
    queue: Mutex<Queue>,
    /// The writer waits here for lines.
    lines: Condvar,
    /// Loggers wait here for room, and [`LogGuard`]'s drop for the last batch.
    room: Condvar,
}

struct Queue {
    buf: Vec<u8>,
    /// Set by [`LogGuard`]'s drop: the writer writes what is queued and stops.
    closing: bool,
    /// The writer is between taking a batch and having written it.
    writing: bool,
}

impl Sink {
    fn new(direct: bool, cap: usize) -> Self {
        Sink {
            cap,
            direct: AtomicBool::new(direct),
            queue: Mutex::new(Queue {
                buf: Vec::with_capacity(BATCH_KEEP),
                closing: false,
                writing: false,
            }),
            lines: Condvar::new(),
            room: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.locked()
    }

    /// Queue one whole line (or write it, direct). The writer is woken by the first line of
    /// a batch and by the line that fills one ([`BATCH_FULL`]), not by the others: under load
    /// a thousand lines cost one wake-up and one `write`, not a context switch each.
    pub fn push(&self, line: &[u8]) {
        if self.direct.load(Ordering::Relaxed) {
            let _ = std::io::stderr().lock().write_all(line);
            return;
        }
        let mut q = self.lock();
        while !q.buf.is_empty() && q.buf.len() + line.len() > self.cap && !q.closing {
            q = crate::sync::wait(&self.room, q);
        }
        if q.closing {
            // The writer is stopping (the process exits): what comes now is written here (it
            // may come out before the last batch).
            drop(q);
            let _ = std::io::stderr().lock().write_all(line);
            return;
        }
        let before = q.buf.len();
        q.buf.extend_from_slice(line);
        let full = self.full();
        let wake = before == 0 || (before < full && q.buf.len() >= full);
        drop(q);
        if wake {
            self.lines.notify_one();
        }
    }

    /// The writer thread: wait for a first line, let the batch gather ([`BATCH_WAIT`] at
    /// most, less when it fills or the sink closes), take it and write it in one go; until
    /// closed and empty.
    fn drain(&self, out: &mut dyn std::io::Write) {
        let mut batch = Vec::with_capacity(BATCH_KEEP);
        loop {
            {
                let mut q = self.lock();
                q.writing = false;
                self.room.notify_all();
                while q.buf.is_empty() && !q.closing {
                    q = crate::sync::wait(&self.lines, q);
                }
                let due = std::time::Instant::now() + BATCH_WAIT;
                while q.buf.len() < self.full() && !q.closing {
                    let left = due.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    q = crate::sync::wait_timeout(&self.lines, q, left);
                }
                if q.buf.is_empty() {
                    return;
                }
                std::mem::swap(&mut q.buf, &mut batch);
                q.writing = true;
            }
            self.room.notify_all();
            // Nowhere to report a failed write of the log itself: the lines are dropped then
            // (stderr closed), not kept to grow without bound.
            let _ = out.write_all(&batch);
            let _ = out.flush();
            batch.clear();
            if batch.capacity() > BATCH_KEEP {
                batch.shrink_to(BATCH_KEEP);
            }
        }
    }

    /// Bytes queued that make a batch full: [`BATCH_FULL`], or half the cap when that is less
    /// (so that the writer is never left waiting while loggers wait for room).
    fn full(&self) -> usize {
        BATCH_FULL.min(self.cap / 2)
    }

    /// Stop the writer after what is queued, and wait until it is written.
    fn close(&self) {
        let mut q = self.lock();
        q.closing = true;
        self.lines.notify_one();
        while !q.buf.is_empty() || q.writing {
            q = crate::sync::wait(&self.room, q);
        }
    }
}

/// `tracing-subscriber`'s writer: each event's formatted line is one `write` into the sink.
struct SinkWriter(&'static Sink);

impl std::io::Write for SinkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The process's logging, once installed: the sink, and how the access line is written.
struct Installed {
    sink: &'static Sink,
    /// Whether the filter lets `tollgate::access` lines through at `info`.
    access: bool,
    json: bool,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// Keeps the background log writer running; drop it last (it writes what is queued).
pub struct LogGuard {
    worker: Option<(&'static Sink, std::thread::JoinHandle<()>)>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        if let Some((sink, worker)) = self.worker.take() {
            sink.close();
            let _ = worker.join();
        }
    }
}

/// Install the log subscriber. Pingora logs through the `log` crate, raw request bytes
/// included; no bridge from `log` is installed, so none of that can reach the output.
pub fn init_logging(format: LogFormat, writer: LogWriter) -> LogGuard {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("TOLLGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: journald, files and log shippers get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let sink: &'static Sink =
        Box::leak(Box::new(Sink::new(writer == LogWriter::Direct, QUEUE_CAP)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(move || SinkWriter(sink));
    let installed = match format {
        LogFormat::Text => tracing::subscriber::set_global_default(builder.finish()),
        LogFormat::Json => tracing::subscriber::set_global_default(builder.json().finish()),
    };
    if installed.is_err() {
        // A subscriber was installed before (a test): it keeps the output.
        return LogGuard { worker: None };
    }
    let _ = INSTALLED.set(Installed {
        sink,
        access: tracing::enabled!(target: "tollgate::access", tracing::Level::INFO),
        // The terminal's colours are `tracing`'s business: the access line stays plain.
        json: format == LogFormat::Json,
    });
    let worker = match writer {
        LogWriter::Direct => None,
        LogWriter::Background => {
            let spawned = std::thread::Builder::new()
                .name("tollgate-log".into())
                .spawn(move || sink.drain(&mut std::io::stderr()));
            if spawned.is_err() {
                // No writer thread: each line is written where it is logged (the few queued
                // so far are written first).
                let mut q = sink.lock();
                let _ = std::io::stderr().lock().write_all(&q.buf);
                q.buf.clear();
                sink.direct.store(true, Ordering::Relaxed);
            }
            spawned.ok().map(|w| (sink, w))
        }
    };
    LogGuard { worker }
}

/// One request's access line: never the key, the `Authorization` header, the path, the query
/// or a body. Fields left `None` are left out of the line.
#[derive(Clone, Copy, Debug)]
pub struct AccessLine<'a> {
    pub request_id: &'a str,
    /// The trace's id (32 hex digits), when the request is recorded (`tracing`).
    pub trace_id: Option<&'a str>,
    pub client: Option<IpAddr>,
    pub method: &'a str,
    pub route: &'a str,
    pub key: &'a str,
    pub plan: &'a str,
    pub status: u16,
    pub outcome: &'a str,
    pub duration: Duration,
    pub upstream: Option<Duration>,
    pub upgrade: Option<&'a str>,
    pub change: Option<&'a str>,
    /// `reason=suspended`, as the contract writes it.
    pub reason: Option<&'a str>,
}

impl AccessLine<'_> {
    /// Write the line, when the filter lets `tollgate::access` through (else nothing: one
    /// load of a flag).
    pub fn log(&self) {
        let Some(installed) = INSTALLED.get().filter(|i| i.access) else {
            return;
        };
        thread_local! {
            static LINE: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(512));
        }
        LINE.with(|line| {
            let Ok(mut line) = line.try_borrow_mut() else {
                return;
            };
            line.clear();
            let now = Stamp::now();
            if installed.json {
                self.write::<Json>(&now, &mut line);
            } else {
                self.write::<Text>(&now, &mut line);
            }
            installed.sink.push(&line);
        });
    }

    /// The fields, in `tracing`'s order, in layout `L`; a field left `None` is left out.
    fn write<L: Layout>(&self, now: &Stamp, out: &mut Vec<u8>) {
        L::start(out, now);
        L::string(out, "request_id", self.request_id);
        if let Some(t) = self.trace_id {
            L::string(out, "trace_id", t);
        }
        if let Some(ip) = self.client {
            L::address(out, "client", ip);
        }
        L::string(out, "method", self.method);
        L::string(out, "route", self.route);
        L::string(out, "key", self.key);
        L::string(out, "plan", self.plan);
        L::name(out, "status");
        out.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        L::string(out, "outcome", self.outcome);
        L::name(out, "duration_ms");
        write_ms(out, self.duration);
        if let Some(up) = self.upstream {
            L::name(out, "upstream_ms");
            write_ms(out, up);
        }
        if let Some(u) = self.upgrade {
            L::string(out, "upgrade", u);
        }
        for (name, word) in [("change", self.change), ("reason", self.reason)] {
            if let Some(w) = word {
                L::word(out, name, w);
            }
        }
        L::end(out);
    }
}

/// How the access line's fields are written: `tracing-subscriber`'s text or JSON layout.
/// Numbers are written bare in both, after [`Layout::name`].
trait Layout {
    /// The time, level, target and message, up to the first field.
    fn start(out: &mut Vec<u8>, now: &Stamp);
    /// A field's name and separator.
    fn name(out: &mut Vec<u8>, name: &str);
    /// A string field, recorded as `&str`.
    fn string(out: &mut Vec<u8>, name: &str, s: &str);
    /// A word field, recorded as `Display` (`change`, `reason`).
    fn word(out: &mut Vec<u8>, name: &str, w: &str);
    /// An address, recorded as `Display`.
    fn address(out: &mut Vec<u8>, name: &str, ip: IpAddr);
    /// What closes the line.
    fn end(out: &mut Vec<u8>);
}

/// `<time>  INFO tollgate::access: request request_id="…" client=… …`, without colours:
/// strings as `Debug` writes them (quoted, escaped), `Display` values bare.
struct Text;

impl Layout for Text {
    fn start(out: &mut Vec<u8>, now: &Stamp) {
        now.write(out);
        out.extend_from_slice(b"  INFO tollgate::access: request");
    }

    fn name(out: &mut Vec<u8>, name: &str) {
        out.push(b' ');
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
    }

    fn string(out: &mut Vec<u8>, name: &str, s: &str) {
        Self::name(out, name);
        if plain(s) {
            quoted(out, s);
        } else {
            let _ = write!(out, "{s:?}");
        }
    }

    fn word(out: &mut Vec<u8>, name: &str, w: &str) {
        Self::name(out, name);
        out.extend_from_slice(w.as_bytes());
    }

    fn address(out: &mut Vec<u8>, name: &str, ip: IpAddr) {
        Self::name(out, name);
        write_ip(out, ip);
    }

    fn end(out: &mut Vec<u8>) {
        out.push(b'\n');
    }
}

/// `{"timestamp":…,"level":"INFO","fields":{"message":"request",…},"target":
/// "tollgate::access"}`: every value but numbers a string, escaped as `serde_json` does.
struct Json;

impl Layout for Json {
    fn start(out: &mut Vec<u8>, now: &Stamp) {
        out.extend_from_slice(b"{\"timestamp\":\"");
        now.write(out);
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"request\"");
    }

    fn name(out: &mut Vec<u8>, name: &str) {
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
    }

    fn string(out: &mut Vec<u8>, name: &str, s: &str) {
        Self::name(out, name);
        if plain(s) {
            quoted(out, s);
        } else {
            let _ = serde_json::to_writer(&mut *out, s);
        }
    }

    fn word(out: &mut Vec<u8>, name: &str, w: &str) {
        Self::string(out, name, w);
    }

    fn address(out: &mut Vec<u8>, name: &str, ip: IpAddr) {
        Self::name(out, name);
        out.push(b'"');
        write_ip(out, ip);
        out.push(b'"');
    }

    fn end(out: &mut Vec<u8>) {
        out.extend_from_slice(b"},\"target\":\"tollgate::access\"}\n");
    }
}

/// Milliseconds to the microsecond, as `f64` written as `serde_json` writes it (the shortest
/// digits that read back the same: for a whole number of µs divided by 1000, at most three
/// decimals, `0.079`, never the float noise of `0.07901100000000001`).
fn write_ms(out: &mut Vec<u8>, d: Duration) {
    out.extend_from_slice(zmij::Buffer::new().format(ms(d)).as_bytes());
}

/// `d` in milliseconds, to the microsecond.
fn ms(d: Duration) -> f64 {
    d.as_micros() as f64 / 1e3
}

/// An address as `Display` writes it: the common IPv4 case by hand, the rest through `fmt`.
fn write_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(itoa::Buffer::new().format(octet).as_bytes());
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// Whether `Debug` and `serde_json` both write `s` between quotes as it is: printable ASCII
/// other than `"` and `\`.
fn plain(s: &str) -> bool {
    s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

/// `"s"`, for a string that needs no escaping ([`plain`]).
fn quoted(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// The time of a line, as `tracing-subscriber` writes it: RFC 3339, UTC, microseconds
/// (`2026-11-26T11:20:50.123456Z`). The date and time of day are worked out once per second
/// per thread and reused.
struct Stamp {
    /// `YYYY-MM-DDTHH:MM:SS`
    second: [u8; 19],
    micros: u32,
}

impl Stamp {
    fn now() -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        thread_local! {
            static LAST: std::cell::Cell<(u64, [u8; 19])> = const { std::cell::Cell::new((u64::MAX, [0; 19])) };
        }
        let secs = since.as_secs();
        let second = LAST.with(|last| {
            let (at, text) = last.get();
            if at == secs {
                return text;
            }
            let text = civil(secs);
            last.set((secs, text));
            text
        });
        Stamp {
            second,
            micros: since.subsec_micros(),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.second);
        out.push(b'.');
        let mut digits = [b'0'; 6];
        let mut m = self.micros;
        for d in digits.iter_mut().rev() {
            *d = b'0' + (m % 10) as u8;
            m /= 10;
        }
        out.extend_from_slice(&digits);
        out.push(b'Z');
    }
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time in seconds (UTC; the day's date by the metering
/// calendar's [`civil_from_days`](crate::metering::civil_from_days)).
fn civil(secs: u64) -> [u8; 19] {
    let (y, m, d) = crate::metering::civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let (h, mi, s) = (rem / 3600, rem / 60 % 60, rem % 60);
    let mut out = [0u8; 19];
    let mut put = |at: usize, v: u64, width: usize| {
        let mut v = v;
        for i in (0..width).rev() {
            out[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, y.clamp(0, 9999) as u64, 4);
    put(5, u64::from(m), 2);
    put(8, u64::from(d), 2);
    put(11, h, 2);
    put(14, mi, 2);
    put(17, s, 2);
    for (at, c) in [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':')] {
        out[at] = c;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    /// The bytes `tracing-subscriber` writes for the access line as the gateway logged it
    /// before it had its own writer (the same fields, the same `info!`), at a fixed time.
    fn through_tracing(a: &AccessLine<'_>, json: bool, at: &'static str) -> String {
        struct Fixed(&'static str);
        impl tracing_subscriber::fmt::time::FormatTime for Fixed {
            fn format_time(
                &self,
                w: &mut tracing_subscriber::fmt::format::Writer<'_>,
            ) -> std::fmt::Result {
                w.write_str(self.0)
            }
        }
        let out = Arc::new(Mutex::new(Vec::new()));
        let captured = Arc::clone(&out);
        let make = move || Capture(Arc::clone(&captured));
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_timer(Fixed(at))
            .with_writer(make);
        let event = || {
            tracing::info!(
                target: "tollgate::access",
                request_id = a.request_id,
                trace_id = a.trace_id,
                client = a.client.map(tracing::field::display),
                method = a.method,
                route = a.route,
                key = a.key,
                plan = a.plan,
                status = a.status,
                outcome = a.outcome,
                duration_ms = ms(a.duration),
                upstream_ms = a.upstream.map(ms),
                upgrade = a.upgrade,
                change = a.change.map(tracing::field::display),
                reason = a.reason.map(tracing::field::display),
                "request"
            );
        };
        if json {
            tracing::subscriber::with_default(builder.json().finish(), event);
        } else {
            tracing::subscriber::with_default(builder.finish(), event);
        }
        let bytes = out.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Capture(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn ours(a: &AccessLine<'_>, json: bool, stamp: &Stamp) -> String {
        let mut out = Vec::new();
        if json {
            a.write::<Json>(stamp, &mut out);
        } else {
            a.write::<Text>(stamp, &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    const AT: &str = "2026-11-26T11:20:50.012345Z";

    fn at() -> Stamp {
        Stamp {
            second: civil(1_795_692_050),
            micros: 12_345,
        }
    }

    fn sample() -> AccessLine<'static> {
        AccessLine {
            request_id: "05ed8c32aaf8c2d10000000000000000",
            trace_id: None,
            client: Some("127.0.0.1".parse().unwrap()),
            method: "POST",
            route: "send_message",
            key: "demo-basic",
            plan: "basic",
            status: 200,
            outcome: "forwarded",
            duration: Duration::from_nanos(2_587_616),
            upstream: Some(Duration::from_nanos(1_439_299)),
            upgrade: None,
            change: None,
            reason: None,
        }
    }

    #[test]
    fn the_stamp_is_tracings() {
        let mut out = Vec::new();
        at().write(&mut out);
        assert_eq!(String::from_utf8(out).unwrap(), AT);
    }

    #[test]
    fn a_forwarded_and_a_refused_line_are_the_bytes_tracing_wrote() {
        let refused = AccessLine {
            client: None,
            route: "-",
            key: "shop-1",
            plan: "-",
            status: 401,
            outcome: "unauthorized",
            upstream: None,
            reason: Some("suspended"),
            ..sample()
        };
        let partner = AccessLine {
            trace_id: Some("0af7651916cd43dd8448eb211c80319c"),
            upgrade: Some("basic->standard"),
            change: Some("partner_suspend"),
            client: Some("2001:db8::1".parse().unwrap()),
            ..sample()
        };
        for a in [sample(), refused, partner] {
            for json in [false, true] {
                assert_eq!(
                    ours(&a, json, &at()),
                    through_tracing(&a, json, AT),
                    "json {json}"
                );
            }
        }
        assert_eq!(
            ours(&sample(), false, &at()),
            "2026-11-26T11:20:50.012345Z  INFO tollgate::access: request \
             request_id=\"05ed8c32aaf8c2d10000000000000000\" client=127.0.0.1 method=\"POST\" \
             route=\"send_message\" key=\"demo-basic\" plan=\"basic\" status=200 \
             outcome=\"forwarded\" duration_ms=2.587 upstream_ms=1.439\n"
        );
    }

    fn word() -> impl Strategy<Value = String> {
        prop_oneof![
            "[ -~]{0,40}",   // printable ASCII, quotes and backslashes included
            "\\PC{0,20}",    // any printable character
            any::<String>(), // anything, control characters included
        ]
    }

    proptest! {
        /// Whatever the strings, addresses and durations, the hand-written line is the line
        /// `tracing-subscriber` writes, in text and in JSON (durations from 100 ns: below it
        /// `Debug` and `serde_json` write floats differently, and no request is that quick).
        #[test]
        fn any_line_is_the_bytes_tracing_writes(
            id in word(), trace in proptest::option::of(word()), method in word(), route in word(), key in word(), plan in word(),
            outcome in word(), upgrade in proptest::option::of(word()),
            v4 in any::<[u8; 4]>(), v6 in any::<[u16; 8]>(), which in 0..3u8,
            status in any::<u16>(),
            nanos in 100u64..3_600_000_000_000, up in proptest::option::of(100u64..3_600_000_000_000),
            change in proptest::option::of(word()), reason in proptest::option::of(word()),
        ) {
            let client = match which {
                0 => None,
                1 => Some(IpAddr::from(v4)),
                _ => Some(IpAddr::from(v6)),
            };
            let a = AccessLine {
                request_id: &id, trace_id: trace.as_deref(), client, method: &method, route: &route, key: &key,
                plan: &plan, status, outcome: &outcome,
                duration: Duration::from_nanos(nanos),
                upstream: up.map(Duration::from_nanos),
                upgrade: upgrade.as_deref(), change: change.as_deref(), reason: reason.as_deref(),
            };
            for json in [false, true] {
                prop_assert_eq!(ours(&a, json, &at()), through_tracing(&a, json, AT));
            }
        }

        /// The calendar: each day's date follows the day before's (months of their length,
        /// leap years by the Gregorian rule), from 1970 to 2200, at any second of the day.
        #[test]
        fn civil_dates_follow_the_calendar(day in 0u64..84_000, second in 0u64..86_400) {
            let date = |secs: u64| {
                let t = civil(secs);
                let n = |a: usize, b: usize| std::str::from_utf8(&t[a..b]).unwrap().parse::<u64>().unwrap();
                (n(0, 4), n(5, 7), n(8, 10), n(11, 13), n(14, 16), n(17, 19))
            };
            let (y, m, d, h, mi, s) = date(day * 86_400 + second);
            prop_assert_eq!((h, mi, s), (second / 3600, second / 60 % 60, second % 60));
            let (y2, m2, d2, ..) = date((day + 1) * 86_400);
            let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
            let len = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m as usize - 1];
            let next = if d < len { (y, m, d + 1) } else if m < 12 { (y, m + 1, 1) } else { (y + 1, 1, 1) };
            prop_assert_eq!((y2, m2, d2), next);
        }
    }

    #[test]
    fn known_dates() {
        for (secs, text) in [
            (0, "1970-01-01T00:00:00"),
            (951_782_400, "2000-02-29T00:00:00"),
            (4_102_444_799, "2099-12-31T23:59:59"),
            (1_795_692_050, "2026-11-26T11:20:50"),
        ] {
            assert_eq!(std::str::from_utf8(&civil(secs)).unwrap(), text);
        }
    }

    /// A writer that holds every write until let go, and keeps what it was given.
    struct Held {
        gate: Arc<(Mutex<bool>, Condvar)>,
        got: Arc<Mutex<Vec<u8>>>,
    }
    impl std::io::Write for Held {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let (open, cv) = &*self.gate;
            let mut o = open.lock().unwrap();
            while !*o {
                o = cv.wait(o).unwrap();
            }
            self.got.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn no_line_is_lost_and_a_stalled_sink_holds_the_loggers_not_the_memory() {
        let sink: &'static Sink = Box::leak(Box::new(Sink::new(false, 4096)));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let got = Arc::new(Mutex::new(Vec::new()));
        let mut out = Held {
            gate: Arc::clone(&gate),
            got: Arc::clone(&got),
        };
        let writer = std::thread::spawn(move || sink.drain(&mut out));
        // Four loggers, 1,000 lines each, while the writer is stalled: the queue never passes
        // its cap (the loggers wait), and once it writes again every line arrives whole.
        let loggers: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        sink.push(format!("thread {t} line {i:04}\n").as_bytes());
                    }
                })
            })
            .collect();
        // The queue fills up to its cap (a line is 20 bytes), and stays there.
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while sink.lock().buf.len() + 20 <= 4096 {
            assert!(std::time::Instant::now() < end, "the queue never filled");
            std::thread::yield_now();
        }
        assert!(sink.lock().buf.len() <= 4096);
        assert!(
            loggers.iter().any(|l| !l.is_finished()),
            "loggers wait for room"
        );
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        for l in loggers {
            l.join().unwrap();
        }
        sink.close();
        writer.join().unwrap();
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        for t in 0..4 {
            let mine: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("thread {t} ")))
                .collect();
            let want: Vec<String> = (0..1000)
                .map(|i| format!("thread {t} line {i:04}"))
                .collect();
            assert_eq!(mine, want, "thread {t}'s lines, in order, none lost");
        }
        assert_eq!(text.lines().count(), 4000);
    }
}
