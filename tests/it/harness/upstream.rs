//! The recording upstream: answers as its [`Mode`] says and keeps every request it read.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::http::{header, read_body, read_head};

/// How the recording upstream answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
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
    /// `200` promising 100 bytes of body, sending 10, then closing: an answer cut short.
    Cut,
    /// This status with `{}`: an upstream that refuses.
    Status(u16),
}

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) request_line: String,
    /// Lower-cased names.
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
    pub(crate) fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
    pub(crate) fn path(&self) -> &str {
        self.request_line.split(' ').nth(1).unwrap_or("")
    }
}

pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
    pub(crate) connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    released: Arc<AtomicBool>,
    /// The held answer's connection was closed by the gateway while held.
    abandoned: Arc<AtomicBool>,
}

impl Upstream {
    pub(crate) fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let abandoned = Arc::new(AtomicBool::new(false));
        let (s, c, st, rel, ab) = (
            Arc::clone(&seen),
            Arc::clone(&connections),
            Arc::clone(&stop),
            Arc::clone(&released),
            Arc::clone(&abandoned),
        );
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !st.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        c.fetch_add(1, Ordering::SeqCst);
                        let flags = (Arc::clone(&st), Arc::clone(&rel), Arc::clone(&ab));
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
            abandoned,
        }
    }

    /// Wait (bounded) until the gateway has closed the connection of the held answer
    /// ([`Mode::HoldFirst`]): it gave the request up (its client left).
    pub(crate) fn wait_abandoned(&self) {
        let end = Instant::now() + Duration::from_secs(20);
        while !self.abandoned.load(Ordering::SeqCst) {
            assert!(
                Instant::now() < end,
                "the gateway never gave up the held request"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Let a held answer ([`Mode::HoldFirst`]) go.
    pub(crate) fn release(&self) {
        self.released.store(true, Ordering::SeqCst);
    }

    /// Wait (bounded) until the upstream has received `n` requests.
    pub(crate) fn wait_for(&self, n: usize) {
        let end = Instant::now() + Duration::from_secs(20);
        while self.count() < n {
            assert!(Instant::now() < end, "the upstream never saw {n} requests");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve_conn(
    stream: TcpStream,
    mode: Mode,
    seen: Arc<Mutex<Vec<Seen>>>,
    (stop, released, abandoned): (Arc<AtomicBool>, Arc<AtomicBool>, Arc<AtomicBool>),
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
            r.get_ref().set_nonblocking(true).ok();
            while !released.load(Ordering::SeqCst)
                && !stop.load(Ordering::SeqCst)
                && Instant::now() < end
            {
                // The gateway closing the connection while the answer is held: it gave up.
                let gone = match r.get_ref().peek(&mut [0u8; 1]) {
                    Ok(n) => n == 0,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                };
                if gone {
                    abandoned.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            r.get_ref().set_nonblocking(false).ok();
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
            Mode::Cut => {
                let _ = w.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":\"12",
                );
                let _ = w.flush();
                let _ = w.shutdown(std::net::Shutdown::Both);
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
