//! Test harness: a recording upstream, an in-process gateway on loopback ports, and a raw
//! HTTP/1.1 client (raw, so path tricks reach the gateway exactly as written).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::clock::ManualClock;
use tollgate::config::Config;
use tollgate::live::LivePolicy;
use tollgate::serve::Running;
use tollgate::testing::NoEnv;

/// How the recording upstream answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `200 {}` with `X-Upstream: yes`.
    Ok,
    /// Read the request, never answer (until the test ends).
    Hang,
    /// Read the request, send half a status line, then close the connection.
    Reset,
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
}

impl Upstream {
    pub fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, c, st) = (
            Arc::clone(&seen),
            Arc::clone(&connections),
            Arc::clone(&stop),
        );
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !st.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        c.fetch_add(1, Ordering::SeqCst);
                        let (s, st) = (Arc::clone(&s), Arc::clone(&st));
                        std::thread::spawn(move || serve_conn(stream, mode, s, st));
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

fn serve_conn(stream: TcpStream, mode: Mode, seen: Arc<Mutex<Vec<Seen>>>, stop: Arc<AtomicBool>) {
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    while let Some((request_line, headers)) = read_head(&mut r) {
        let Some(body) = read_body(&mut r, &headers, false) else {
            return;
        };
        seen.lock().unwrap().push(Seen {
            request_line,
            headers,
            body,
        });
        match mode {
            Mode::Ok => {
                let resp = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Upstream: yes\r\nContent-Length: 2\r\n\r\n{}";
                if w.write_all(resp.as_bytes()).is_err() {
                    return;
                }
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

/// A port nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The standard test config, with the upstream at `upstream` and `extra` YAML appended.
pub fn config_yaml(upstream: &str, extra: &str) -> String {
    let base = tollgate::testing::CONFIG_YAML
        .replace(
            "\nlisten: \"127.0.0.1:0\"",
            &format!("\nlisten: \"127.0.0.1:{}\"", closed_port()),
        )
        .replace(
            "admin_listen: \"127.0.0.1:0\"",
            &format!("admin_listen: \"127.0.0.1:{}\"", closed_port()),
        )
        .replace(
            "base_url: \"http://127.0.0.1:9\"",
            &format!("base_url: \"{upstream}\""),
        );
    format!("{base}{extra}")
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
    pub fn start(yaml: &str) -> Self {
        let config =
            Config::parse(yaml, Path::new("test.yaml"), &NoEnv).expect("valid test config");
        Self::start_config(config)
    }

    pub fn start_config(config: Config) -> Self {
        let clock = Arc::new(ManualClock::new());
        let addr = config.listen;
        let built =
            tollgate::serve::build(config.clone(), clock.clone(), None).expect("server builds");
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

    /// A gateway in front of `upstream`.
    pub fn with(upstream: &Upstream, extra: &str) -> Self {
        Self::start(&config_yaml(&format!("http://{}", upstream.addr), extra))
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

pub fn read_response(r: &mut BufReader<TcpStream>) -> Response {
    let (status_line, headers) = read_head(r).expect("a response head");
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let body = read_body(r, &headers, true).expect("a complete response body");
    Response {
        status,
        headers,
        body,
    }
}

pub const EVENT: &str = r#"{"name":"Standup","type":"event","groupId":"g-1","startTime":"2026-11-21T10:00:00.000Z","eventOptions":{"callType":"voice","description":"Daily"}}"#;
