//! `tollgate stand-in` as the load scripts run it: the real binary on a free loopback port,
//! stopped with SIGTERM (`kill`). It must be gone within a second, idle keep-alive connection
//! or not: with Pingora's defaults it waited its 300 s grace period (see
//! `tollgate::demo::stand_in_server_conf`).

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::harness::{closed_port, eventually, try_read_response, try_send_raw, Process};

/// How long the stand-in may take to exit after SIGTERM.
const EXIT_WITHIN: Duration = Duration::from_secs(1);
/// How long the test waits for the exit before it gives up (and kills the process).
const DEADLINE: Duration = Duration::from_secs(5);

const GET: &[u8] = b"GET /v2/anything HTTP/1.1\r\nHost: stand-in\r\n\r\n";

#[test]
fn stand_in_exits_within_a_second_of_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = closed_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let listen = addr.to_string();
    let mut p = Process::spawn(
        dir.path(),
        "stand-in",
        &["stand-in", "--listen", &listen],
        &[],
    );

    // It answers HTTP (bounded: `eventually` gives up after 20 s).
    eventually("the stand-in answers", || {
        try_send_raw(addr, GET).is_some_and(|r| r.status == 200 && r.body == b"{}")
    });
    // A keep-alive connection, used once and left idle, as a load tool leaves its own.
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    idle.write_all(GET).unwrap();
    let mut idle_r = BufReader::new(idle.try_clone().unwrap());
    let first = try_read_response(&mut idle_r).expect("an answer on the idle connection");
    assert_eq!(first.status, 200);

    let t0 = Instant::now();
    p.signal("TERM");
    // Bounded: past the deadline the test fails, and `Process`'s drop kills the stand-in.
    let status = p.wait_exit(DEADLINE);
    let took = t0.elapsed();
    eprintln!("stand-in exited {took:?} after SIGTERM");
    let status = status.unwrap_or_else(|| {
        panic!(
            "the stand-in still runs {DEADLINE:?} after SIGTERM\n{}",
            p.output()
        )
    });
    assert!(
        took <= EXIT_WITHIN,
        "the stand-in took {took:?} to exit after SIGTERM (at most {EXIT_WITHIN:?})\n{}",
        p.output()
    );
    assert!(status.success(), "{status:?}\n{}", p.output());
    assert!(
        p.output()
            .contains(&format!("stand-in upstream on http://{listen}")),
        "{}",
        p.output()
    );
    // Nothing listens any more.
    assert!(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err());
}
