//! A raw HTTP/1.1 client (raw, so path tricks reach the gateway exactly as written), the
//! head and body reader it shares with the recording upstream, and the admin listener's
//! helpers (readiness, metrics).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The first value of header `name` (lower-case) in a parsed head.
pub(super) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// Read one HTTP/1.1 head: the start line and the headers (names lower-cased); `None` at EOF.
pub(super) fn read_head(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<(String, String)>)> {
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
pub(super) fn read_body(
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

#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    /// Lower-cased names.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Response {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {:?}", String::from_utf8_lossy(&self.body)))
    }
    /// The problem `code`, asserting the problem+json shape.
    pub(crate) fn code(&self) -> String {
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
    pub(crate) fn remaining(&self) -> u32 {
        let v = self.header("ratelimit").expect("RateLimit header");
        v.split(';')
            .find_map(|p| p.strip_prefix("r="))
            .unwrap()
            .parse()
            .unwrap()
    }
}

/// Send raw bytes on a new connection and read one response (until Content-Length or close).
pub(crate) fn send_raw(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(raw).unwrap();
    read_response(&mut BufReader::new(s))
}

/// [`send_raw`] that gives `None` instead of panicking when the server is gone (a test that
/// kills it mid-stream).
pub(crate) fn try_send_raw(addr: SocketAddr, raw: &[u8]) -> Option<Response> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    s.write_all(raw).ok()?;
    try_read_response(&mut BufReader::new(s))
}

pub(crate) fn read_response(r: &mut BufReader<TcpStream>) -> Response {
    try_read_response(r).expect("a complete response")
}

/// One response, or `None` when the connection ends before a complete one.
pub(crate) fn try_read_response(r: &mut BufReader<TcpStream>) -> Option<Response> {
    let (status_line, headers) = read_head(r)?;
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok())?;
    let body = read_body(r, &headers, true)?;
    Some(Response {
        status,
        headers,
        body,
    })
}

pub(crate) const EVENT: &str = r#"{"name":"Standup","type":"event","groupId":"g-1","startTime":"2026-11-21T10:00:00.000Z","eventOptions":{"callType":"voice","description":"Daily"}}"#;

/// `METHOD path` on an admin listener at `addr`, on a new connection.
pub(crate) fn admin(addr: SocketAddr, method: &str, path: &str) -> Response {
    admin_with(addr, method, path, None)
}

/// [`admin`], with `Authorization: Bearer <token>` when a token is given.
pub(crate) fn admin_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Response {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    send_raw(addr, raw.as_bytes())
}

/// Poll (bounded) until `GET /readyz` on `addr` answers `status`.
pub(crate) fn wait_ready(addr: SocketAddr, status: u16) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        // One connection at a time (the admin listener gives one address a share of its
        // cap), and a refused one is a try, not a failure.
        let listening = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok();
        let got = if listening {
            let raw = format!(
                "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            try_send_raw(addr, raw.as_bytes()).map(|r| r.status)
        } else {
            None
        };
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

/// The value of the series `series` (full label set, as printed) in a metrics page.
pub(crate) fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `GET /metrics` on the admin listener at `addr`.
pub(crate) fn metrics_page(addr: SocketAddr) -> String {
    let r = admin(addr, "GET", "/metrics");
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .is_some_and(|v| v.starts_with("text/plain; version=0.0.4")));
    String::from_utf8(r.body).unwrap()
}

/// A TCP connection to `addr` from the local address `from` (127.0.0.2 is a second client).
pub(crate) fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let local: SocketAddr = format!("{from}:0").parse().unwrap();
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&local.into()).unwrap();
    s.connect_timeout(&addr.into(), Duration::from_secs(5))
        .unwrap();
    s.into()
}

/// Read from `s` until the peer closes it or `limit` passes: what was read, and how long
/// after the call the connection closed (`None`: still open at the limit).
pub(crate) fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Option<Duration>) {
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

/// `METHOD path` with a JSON body on the admin listener at `addr`.
pub(crate) fn admin_json(addr: SocketAddr, method: &str, path: &str, body: &str) -> Response {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes())
}

/// `GET /v2/client/getStatus` with `key` on the gateway at `addr`.
pub(crate) fn get_status(addr: SocketAddr, key: &str) -> Response {
    let raw = format!(
        "GET /v2/client/getStatus HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    send_raw(addr, raw.as_bytes())
}
