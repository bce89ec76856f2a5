//! Test harness: a recording upstream, an in-process gateway on loopback ports, and a raw
//! HTTP/1.1 client (raw, so path tricks reach the gateway exactly as written).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::runtime::live::LivePolicy;
pub use tollgate_core::testing::TestConfig;

/// How the recording upstream answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `200 {}` with `X-Upstream: yes`.
    Ok,
    /// Read the request, never answer (until the test ends).
    Hang,
    /// Read the request, send half a status line, then close the connection.
    Reset,
    /// Hold the answer to the first request until [`Upstream::release`]; answer the rest as `Ok`.
    HoldFirst,
    /// `200` with a 64 MiB body.
    Big,
    /// `101 Switching Protocols`, then raw bytes: an upstream that tries to open a tunnel.
    Switch,
    /// This status with `{}`: an upstream that refuses.
    Status(u16),
}

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub request_line: String,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The first value of header `name` (lower-case) in a parsed head.
fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
    pub fn path(&self) -> &str {
        self.request_line.split(' ').nth(1).unwrap_or("")
    }
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
}

impl Upstream {
    pub fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let (s, c, st, rel) = (
            Arc::clone(&seen),
            Arc::clone(&connections),
            Arc::clone(&stop),
            Arc::clone(&released),
        );
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !st.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        c.fetch_add(1, Ordering::SeqCst);
                        let flags = (Arc::clone(&st), Arc::clone(&rel));
                        let s = Arc::clone(&s);
                        std::thread::spawn(move || serve_conn(stream, mode, s, flags));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Self {
            addr,
            seen,
            connections,
            stop,
            released,
        }
    }

    /// Let a held answer ([`Mode::HoldFirst`]) go.
    pub fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// Wait (bounded) until the upstream has received `n` requests.
    pub fn wait_for(&self, n: usize) {
        let end = Instant::now() + Duration::from_secs(20);
        while self.count() < n {
            assert!(Instant::now() < end, "the upstream never saw {n} requests");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Read one HTTP/1.1 head: the start line and the headers (names lower-cased); `None` at EOF.
fn read_head(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<(String, String)>)> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let start_line = line.trim_end().to_string();
    let mut headers = Vec::new();
    loop {
        line.clear();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':')?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    Some((start_line, headers))
}

/// Read the body that follows `headers`: chunked, by Content-Length, or — when neither is
/// given — empty for a request and up to the close for a response.
fn read_body(
    r: &mut BufReader<TcpStream>,
    headers: &[(String, String)],
    is_response: bool,
) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    if header(headers, "transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            if n == 0 {
                return Some(body);
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    match header(headers, "content-length") {
        Some(v) => {
            body.resize(v.parse().ok()?, 0);
            r.read_exact(&mut body).ok()?;
        }
        None if is_response => {
            r.read_to_end(&mut body).ok()?;
        }
        None => {}
    }
    Some(body)
}

fn serve_conn(
    stream: TcpStream,
    mode: Mode,
    seen: Arc<Mutex<Vec<Seen>>>,
    (stop, released): (Arc<AtomicBool>, Arc<AtomicBool>),
) {
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    while let Some((request_line, headers)) = read_head(&mut r) {
        let Some(body) = read_body(&mut r, &headers, false) else {
            return;
        };
        let first = {
            let mut seen = seen.lock().unwrap();
            seen.push(Seen {
                request_line,
                headers,
                body,
            });
            seen.len() == 1
        };
        if mode == Mode::HoldFirst && first {
            let end = Instant::now() + Duration::from_secs(30);
            while !released.load(Ordering::SeqCst)
                && !stop.load(Ordering::SeqCst)
                && Instant::now() < end
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        match mode {
            Mode::Ok | Mode::HoldFirst => {
                let resp = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Upstream: yes\r\nContent-Length: 2\r\n\r\n{}";
                if w.write_all(resp.as_bytes()).is_err() {
                    return;
                }
            }
            Mode::Big => {
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 67108864\r\n\r\n";
                if w.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let chunk = vec![b'x'; 1 << 20];
                for _ in 0..64 {
                    if w.write_all(&chunk).is_err() {
                        return;
                    }
                }
            }
            Mode::Status(code) => {
                let resp = format!(
                    "HTTP/1.1 {code} Refused\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
                );
                if w.write_all(resp.as_bytes()).is_err() {
                    return;
                }
            }
            Mode::Switch => {
                let resp = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\ntunnel bytes";
                let _ = w.write_all(resp.as_bytes());
                return;
            }
            Mode::Hang => {
                let end = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return;
            }
            Mode::Reset => {
                let _ = w.write_all(b"HTTP/1.1 20");
                let _ = w.flush();
                // Both halves shut: the gateway sees the response cut off mid-way.
                let _ = w.shutdown(std::net::Shutdown::Both);
                return;
            }
        }
    }
}

/// A private CA and one leaf it signed (PEM).
pub struct Pki {
    pub ca_pem: String,
    pub leaf_pem: String,
    pub leaf_key_pem: String,
}

/// A fresh CA named `ca_name` and a leaf for `names` (IP literals become IP SANs).
pub fn pki(ca_name: &str, names: &[&str]) -> Pki {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, ca_name);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf_params =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, names[0]);
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    Pki {
        ca_pem: ca.pem(),
        leaf_pem: leaf.pem(),
        leaf_key_pem: leaf_key.serialize_pem(),
    }
}

/// Write `text` to `dir/name`; the path as a string.
pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().expect("UTF-8 temp path").to_string()
}

/// A port nothing listens on (bound, then released), never one handed out before in this
/// test binary: tests run in parallel, and the kernel may offer a port another test was just
/// given and has not bound yet.
pub fn closed_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// The standard test config ([`TestConfig`]) on fresh loopback ports, in front of `upstream`
/// (a base URL).
pub fn test_config(upstream: &str) -> TestConfig {
    TestConfig::new()
        .listen(format!("127.0.0.1:{}", closed_port()))
        .admin_listen(format!("127.0.0.1:{}", closed_port()))
        .upstream(upstream)
}

/// [`test_config`] in front of the recording upstream `up`.
pub fn config_for(up: &Upstream) -> TestConfig {
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

pub struct Gateway {
    pub addr: SocketAddr,
    pub clock: Arc<ManualClock>,
    pub config: Config,
    /// The config in force, for reloads from the test.
    pub live: Arc<LivePolicy>,
    _running: Running,
}

impl Gateway {
    /// A gateway serving `config`.
    pub fn start(config: &TestConfig) -> Self {
        Self::start_config(config.parse())
    }

    pub fn start_config(config: Config) -> Self {
        let clock = Arc::new(ManualClock::new());
        let addr = config.process.listen;
        let built =
            tollgate::server::build(config.clone(), clock.clone(), None).expect("server builds");
        let live = built.live;
        let running = Running::spawn(built.server);
        wait_listening(addr);
        Self {
            addr,
            clock,
            config,
            live,
            _running: running,
        }
    }

    /// A gateway serving the config file at `path` (so that reloads re-read it).
    pub fn start_file(path: &Path) -> Self {
        Self::start_config(Config::load(path).expect("valid test config"))
    }

    /// A gateway with the standard test config in front of `upstream`.
    pub fn with(upstream: &Upstream) -> Self {
        Self::start(&config_for(upstream))
    }

    pub fn send(&self, raw: &[u8]) -> Response {
        send_raw(self.addr, raw)
    }

    /// A request with `Connection: close`, `Host`, and the given headers and body.
    pub fn request(
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
    pub fn admin(&self, method: &str, path: &str) -> Response {
        admin(self.config.process.admin_listen, method, path)
    }

    /// `request` with `Authorization: Bearer <key>` and, for a body, JSON content type.
    pub fn call(&self, key: &str, method: &str, path: &str, body: &str) -> Response {
        let auth = format!("Bearer {key}");
        let mut h = vec![("Authorization", auth.as_str())];
        if !body.is_empty() {
            h.push(("Content-Type", "application/json"));
        }
        self.request(method, path, &h, body.as_bytes())
    }
}

pub fn wait_listening(addr: SocketAddr) {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{addr} never started listening");
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {:?}", String::from_utf8_lossy(&self.body)))
    }
    /// The problem `code`, asserting the problem+json shape.
    pub fn code(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let v = self.json();
        assert_eq!(v["status"], self.status, "{v}");
        for f in ["type", "title", "detail"] {
            assert!(v[f].is_string(), "{f} missing in {v}");
        }
        v["code"].as_str().unwrap().to_string()
    }
    /// `r=` of the `RateLimit` header.
    pub fn remaining(&self) -> u32 {
        let v = self.header("ratelimit").expect("RateLimit header");
        v.split(';')
            .find_map(|p| p.strip_prefix("r="))
            .unwrap()
            .parse()
            .unwrap()
    }
}

/// Send raw bytes on a new connection and read one response (until Content-Length or close).
pub fn send_raw(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(raw).unwrap();
    read_response(&mut BufReader::new(s))
}

/// [`send_raw`] that gives `None` instead of panicking when the server is gone (a test that
/// kills it mid-stream).
pub fn try_send_raw(addr: SocketAddr, raw: &[u8]) -> Option<Response> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    s.write_all(raw).ok()?;
    try_read_response(&mut BufReader::new(s))
}

pub fn read_response(r: &mut BufReader<TcpStream>) -> Response {
    try_read_response(r).expect("a complete response")
}

/// One response, or `None` when the connection ends before a complete one.
pub fn try_read_response(r: &mut BufReader<TcpStream>) -> Option<Response> {
    let (status_line, headers) = read_head(r)?;
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok())?;
    let body = read_body(r, &headers, true)?;
    Some(Response {
        status,
        headers,
        body,
    })
}

pub const EVENT: &str = r#"{"name":"Standup","type":"event","groupId":"g-1","startTime":"2026-11-21T10:00:00.000Z","eventOptions":{"callType":"voice","description":"Daily"}}"#;

/// `METHOD path` on an admin listener at `addr`, on a new connection.
pub fn admin(addr: SocketAddr, method: &str, path: &str) -> Response {
    admin_with(addr, method, path, None)
}

/// [`admin`], with `Authorization: Bearer <token>` when a token is given.
pub fn admin_with(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> Response {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    send_raw(addr, raw.as_bytes())
}

/// Poll (bounded) until `GET /readyz` on `addr` answers `status`.
pub fn wait_ready(addr: SocketAddr, status: u16) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let got = TcpStream::connect_timeout(&addr, Duration::from_millis(200))
            .ok()
            .map(|_| admin(addr, "GET", "/readyz").status);
        if got == Some(status) {
            return;
        }
        assert!(
            Instant::now() < end,
            "/readyz on {addr} never answered {status} (last: {got:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `tollgate` binary running as its own process, killed when dropped. Its stdout and
/// stderr go to files, so a test can read everything it printed.
pub struct Process {
    pub child: std::process::Child,
    pub stdout: std::path::PathBuf,
    pub stderr: std::path::PathBuf,
}

impl Process {
    /// `tollgate <args>` with `env`, output captured under `dir` with `tag` in the file names.
    pub fn spawn(dir: &Path, tag: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let stdout = dir.join(format!("{tag}.stdout"));
        let stderr = dir.join(format!("{tag}.stderr"));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("the tollgate binary starts");
        remember_failures();
        Self {
            child,
            stdout,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal by name (`HUP`, `TERM`, `QUIT`, `INT`).
    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -s {name} failed");
    }

    /// Wait (bounded by `limit`) for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop it as an operator would (SIGINT), so every queued log line is written; wait
    /// (bounded) for the exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.signal("INT");
        self.wait_exit(Duration::from_secs(15))
            .expect("exits on SIGINT")
    }

    /// Everything it printed so far, stdout then stderr.
    pub fn output(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!("{}{}", read(&self.stdout), read(&self.stderr))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let out = self.output();
            // A panic of the process itself, whose backtrace would push its message out of the
            // tail below.
            let lines: Vec<&str> = out.lines().collect();
            for (i, l) in lines.iter().enumerate() {
                if l.contains("panicked at") {
                    eprintln!("--- {} panicked:", self.stdout.display());
                    for l in &lines[i..(i + 3).min(lines.len())] {
                        eprintln!("{l}");
                    }
                }
            }
            let tail: Vec<&str> = lines.iter().rev().take(40).copied().collect();
            eprintln!("--- {} output (last lines) ---", self.stdout.display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
            // The failure itself came before every process's lines: say it again after them, so
            // that the end of a long log (all a CI summary may show) names what failed.
            if let Some(why) = failure_of_this_thread() {
                eprintln!("--- the failure above, again: {why}");
            }
        }
    }
}

/// Each test thread's panic message, kept by the hook [`remember_failures`] installs.
static FAILURES: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Install (once) a panic hook that keeps each thread's panic message for [`Process`]'s drop,
/// then prints it as the default hook does.
fn remember_failures() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("?").to_string();
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let what = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if let Ok(mut f) = FAILURES.lock() {
                f.push((thread, format!("{what}{at}")));
            }
            default(info);
        }));
    });
}

fn failure_of_this_thread() -> Option<String> {
    let thread = std::thread::current().name().unwrap_or("?").to_string();
    let f = FAILURES.lock().ok()?;
    f.iter()
        .rev()
        .find(|(t, _)| *t == thread)
        .map(|(_, m)| m.clone())
}

/// The value of the series `series` (full label set, as printed) in a metrics page.
pub fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `GET /metrics` on the admin listener at `addr`.
pub fn metrics_page(addr: SocketAddr) -> String {
    let r = admin(addr, "GET", "/metrics");
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .is_some_and(|v| v.starts_with("text/plain; version=0.0.4")));
    String::from_utf8(r.body).unwrap()
}

/// Poll (bounded) until `f` holds.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP connection to `addr` from the local address `from` (127.0.0.2 is a second client).
pub fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let local: SocketAddr = format!("{from}:0").parse().unwrap();
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&local.into()).unwrap();
    s.connect_timeout(&addr.into(), Duration::from_secs(5))
        .unwrap();
    s.into()
}

/// Read from `s` until the peer closes it or `limit` passes: what was read, and how long
/// after the call the connection closed (`None`: still open at the limit).
pub fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Option<Duration>) {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return (got, Some(start.elapsed())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (got, Some(start.elapsed())),
        }
    }
    (got, None)
}

/// A `redis-server` of the test's own, on a free loopback port, with no persistence; killed
/// (and its directory removed) when dropped. `.ci/run` installs `redis-server` when missing.
pub struct RedisServer {
    pub port: u16,
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> Self {
        let port = closed_port();
        Self::start_on(port)
    }

    /// A server on `port` (to bring one back where a killed one was).
    pub fn start_on(port: u16) -> Self {
        Self::spawn(port, &[])
    }

    /// A node of a Redis Cluster, not yet joined ([`RedisCluster`]).
    pub fn start_cluster_node() -> Self {
        Self::spawn(
            closed_port(),
            &[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
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

    pub fn url(&self) -> String {
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
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal by name (`STOP`, `CONT`, `KILL`).
    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -s {name} redis-server failed");
    }

    /// Kill it and wait for it to be gone; the port is free again.
    pub fn kill(mut self) -> u16 {
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
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(n: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..n).map(|_| RedisServer::start_cluster_node()).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let out = std::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
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
        cluster
    }

    /// Every name held by any node.
    pub fn names(&self) -> Vec<String> {
        let mut all = Vec::new();
        for n in &self.nodes {
            let names: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut n.client()).unwrap();
            all.extend(names);
        }
        all.sort();
        all
    }
}
