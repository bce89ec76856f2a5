//! A TCP proxy on a loopback port that holds every byte for a fixed time in each direction:
//! a server in another zone, without leaving the machine. It can also hold connections past
//! the first few until the test lets them through ([`DelayProxy::holding_after`]): a server
//! that stops answering at a point the test chooses.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::closed_port;

/// How often the proxy's threads look at the stop flag.
const POLL: Duration = Duration::from_millis(20);

/// The proxy; it stops, and closes every connection it carries, when dropped.
pub(crate) struct DelayProxy {
    /// Where it listens (127.0.0.1).
    pub(crate) port: u16,
    stop: Arc<AtomicBool>,
    /// Set when the connections held may go through.
    released: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl DelayProxy {
    /// A proxy to `target` that delays each chunk of bytes by `delay` each way (a round trip
    /// through it takes `2 × delay` more than one to `target`).
    pub(crate) fn start(target: SocketAddr, delay: Duration) -> Self {
        Self::start_with(target, delay, usize::MAX)
    }

    /// A proxy to `target` without delay that carries its first `pass` connections and holds
    /// every later one (accepted, nothing read, no connection to `target`) until
    /// [`DelayProxy::release`].
    pub(crate) fn holding_after(target: SocketAddr, pass: usize) -> Self {
        Self::start_with(target, Duration::ZERO, pass)
    }

    /// Let the connections held go through (and every later one).
    pub(crate) fn release(&self) {
        self.released.store(true, Ordering::Relaxed);
    }

    fn start_with(target: SocketAddr, delay: Duration, pass: usize) -> Self {
        let port = closed_port();
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("the proxy's port binds");
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let released = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let open = Arc::clone(&released);
        let accept = std::thread::spawn(move || {
            let mut pumps = Vec::new();
            let (mut held, mut accepted) = (Vec::new(), 0usize);
            while !flag.load(Ordering::Relaxed) {
                if open.load(Ordering::Relaxed) {
                    for client in held.drain(..) {
                        pumps.extend(carry(client, target, delay, &flag));
                    }
                }
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        accepted += 1;
                        if accepted > pass && !open.load(Ordering::Relaxed) {
                            held.push(client);
                            continue;
                        }
                        pumps.extend(carry(client, target, delay, &flag));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(POLL); // polling the stop and release flags
                    }
                    Err(_) => break,
                }
            }
            for p in pumps {
                let _ = p.join();
            }
        });
        Self {
            port,
            stop,
            released,
            accept: Some(accept),
        }
    }

    /// A `redis://` URL through the proxy.
    pub(crate) fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Carry `client`'s connection to `target` both ways: the pumps, none when `target` refuses.
fn carry(
    client: TcpStream,
    target: SocketAddr,
    delay: Duration,
    stop: &Arc<AtomicBool>,
) -> Vec<JoinHandle<()>> {
    let Ok(server) = TcpStream::connect(target) else {
        return Vec::new();
    };
    let mut pumps = Vec::new();
    for (from, to) in [(&client, &server), (&server, &client)] {
        let (from, to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
        pumps.extend(pump(from, to, delay, Arc::clone(stop)));
    }
    pumps
}

/// Carry `from`'s bytes to `to`, each chunk `delay` after it was read: a reader that stamps
/// chunks and a writer that sends each at its time, so that the delay does not add up over a
/// stream. Both stop at the end of the stream, on an error, or when `stop` is set.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
    stop: Arc<AtomicBool>,
) -> [JoinHandle<()>; 2] {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    from.set_read_timeout(Some(POLL)).unwrap();
    let reading = Arc::clone(&stop);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 16 * 1024];
        while !reading.load(Ordering::Relaxed) {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    });
    let writer = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match rx.recv_timeout(POLL) {
                Ok((due, bytes)) => {
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait); // the latency the proxy adds
                    }
                    if to.write_all(&bytes).is_err() {
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    [reader, writer]
}
