//! `tollgate demo` end to end: the real binary on free loopback ports, and every curl line it
//! prints, run through bash, gives the answer its comment promises.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{closed_port, wait_listening, Process};

/// Bound on every wait: start-up, each port, each command.
const WAIT: Duration = Duration::from_secs(30);

/// Run `line` with `bash -c`, bounded by [`WAIT`]; its stdout and stderr.
fn run(line: &str, curl_home: &Path) -> String {
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(line)
        // A .curlrc with --max-time, and no proxy between curl and loopback.
        .env("CURL_HOME", curl_home)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("all_proxy")
        .env_remove("ALL_PROXY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let end = Instant::now() + WAIT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("command did not finish in {WAIT:?}: {line}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (out, err) = (t_out.join().unwrap(), t_err.join().unwrap());
    assert!(status.success(), "{line}\nexit {status}\n{out}\n{err}");
    out
}

/// `uniq -c` output (`     41 200`) as (count, value) pairs.
fn uniq_counts(out: &str) -> Vec<(u32, String)> {
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let n = it.next()?.parse().ok()?;
            Some((n, it.next()?.to_string()))
        })
        .collect()
}

#[test]
fn demo_prints_curl_lines_that_show_each_answer() {
    if crate::harness::curl_missing("demo_prints_curl_lines_that_show_each_answer") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".curlrc"), "max-time = 10\n").unwrap();

    let (port, upstream_port, admin_port) = loop {
        let (a, b, c) = (closed_port(), closed_port(), closed_port());
        if a != b && b != c && a != c {
            break (a, b, c);
        }
    };
    let demo = Process::spawn(
        dir.path(),
        "demo",
        &[
            "demo",
            "--port",
            &port.to_string(),
            "--upstream-port",
            &upstream_port.to_string(),
            "--admin-port",
            &admin_port.to_string(),
        ],
        &[("TOLLGATE_LOG", "warn")],
    );

    // What it prints, up to the last line of the banner (bounded).
    let end = Instant::now() + WAIT;
    let printed: Vec<String> = loop {
        let out = std::fs::read_to_string(&demo.stdout).unwrap_or_default();
        if out.lines().any(|l| l.starts_with("Ctrl-C")) {
            break out.lines().map(String::from).collect();
        }
        assert!(Instant::now() < end, "demo output incomplete:\n{out}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let gateway: SocketAddr = ([127, 0, 0, 1], port).into();
    wait_listening(gateway);
    wait_listening(([127, 0, 0, 1], upstream_port).into());

    // Each `# ...` comment is followed by one command line.
    let mut commands = Vec::new();
    for (i, line) in printed.iter().enumerate() {
        if let Some(what) = line.strip_prefix("# ") {
            let cmd = printed
                .get(i + 1)
                .unwrap_or_else(|| panic!("no command after {line:?}"));
            assert!(cmd.starts_with("curl ") || cmd.starts_with("for "), "{cmd}");
            assert!(
                cmd.contains(&format!("http://127.0.0.1:{port}/")),
                "the line targets the gateway's port: {cmd}"
            );
            commands.push((what.to_string(), cmd.clone()));
        }
    }
    assert_eq!(commands.len(), 5, "{printed:#?}");

    let curl_home = dir.path();
    let out: Vec<String> = commands
        .iter()
        .map(|(_, cmd)| run(cmd, curl_home))
        .collect();
    let ctx = |i: usize| format!("{}\n$ {}\n{}", commands[i].0, commands[i].1, out[i]);

    assert!(out[0].contains("HTTP/1.1 200"), "{}", ctx(0));
    assert!(out[0].contains("{}"), "{}", ctx(0));
    assert!(out[1].contains("HTTP/1.1 401"), "{}", ctx(1));
    assert!(out[2].contains("HTTP/1.1 403"), "{}", ctx(2));
    assert!(out[2].contains("plan_restricted"), "{}", ctx(2));
    assert!(out[3].contains("HTTP/1.1 400"), "{}", ctx(3));
    assert!(out[3].contains("invalid_body"), "{}", ctx(3));

    let counts = uniq_counts(&out[4]);
    let count_of = |code: &str| {
        counts
            .iter()
            .filter(|(_, c)| c == code)
            .map(|(n, _)| *n)
            .sum::<u32>()
    };
    let (ok, limited) = (count_of("200"), count_of("429"));
    eprintln!("demo burst: {ok} x 200, {limited} x 429");
    assert_eq!(counts.iter().map(|(n, _)| n).sum::<u32>(), 60, "{}", ctx(4));
    assert!(ok >= 40, "{}", ctx(4));
    assert!(limited >= 1, "{}", ctx(4));
    assert_eq!(ok + limited, 60, "only 200s and 429s: {}", ctx(4));

    drop(demo);
    // The guard killed it: the port is free again (bounded).
    let end = Instant::now() + WAIT;
    while TcpStream::connect_timeout(&gateway, Duration::from_millis(200)).is_ok() {
        assert!(
            Instant::now() < end,
            "the demo still listens after the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
