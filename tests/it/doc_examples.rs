//! The docs' shell examples, run as written: the README's quick start (the real binary, its
//! own config, a reload and a metric) and the blocked-address example of docs/operations.md,
//! each on free loopback ports. And the rule that keeps it so: every `curl` line in the
//! README, `docs/` and `deploy/README.md` is inside one of the blocks these tests run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{closed_port, config_for, send_raw, Gateway, Mode, Upstream};

/// The blocks the tests below run: (file, the heading the block follows).
const RUN: &[(&str, &str)] = &[
    ("README.md", "## Quick start"),
    ("docs/operations.md", "### Blocked addresses"),
    ("docs/operations.md", "### Revoking a leaked key"),
    ("docs/operations.md", "### A key's quota and its ledger"),
    ("docs/operations.md", "#### Signing up a customer"),
    (
        "docs/operations.md",
        "#### Rotating a key and answering a leak",
    ),
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The first ```sh block after `heading` in `file`.
fn block(file: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let at = text
        .lines()
        .position(|l| l == heading)
        .unwrap_or_else(|| panic!("{file} has no `{heading}`"));
    let mut lines = text.lines().skip(at);
    lines
        .by_ref()
        .find(|l| *l == "```sh")
        .unwrap_or_else(|| panic!("{file}: no sh block after `{heading}`"));
    lines
        .take_while(|l| *l != "```")
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Run `script` with bash in `dir`, its own process group killed when it ends (whatever it
/// left running), bounded by `limit`. Its stdout.
fn bash(dir: &Path, script: &str, env: &[(&str, &str)], limit: Duration) -> String {
    use std::os::unix::process::CommandExt;
    let out = dir.join("stdout");
    let err = dir.join("stderr");
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .envs(env.iter().copied())
        .env("CURL_HOME", dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= end {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .stderr(Stdio::null())
        .status();
    let _ = child.wait();
    let stdout = std::fs::read_to_string(&out).unwrap();
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "the example failed ({status:?})\n--- script\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    stdout
}

#[test]
fn the_readme_quick_start_does_what_it_prints() {
    if crate::harness::curl_missing("the_readme_quick_start_does_what_it_prints") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".curlrc"), "max-time = 10\n").unwrap();
    let written = block("README.md", "## Quick start");
    let (gw, up, admin) = (closed_port(), closed_port(), closed_port());
    let script = written
        .replace(
            "T=target/release/tollgate",
            &format!("T={}", env!("CARGO_BIN_EXE_tollgate")),
        )
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{gw}"))
        .replace("127.0.0.1:8081", &format!("127.0.0.1:{up}"))
        .replace("127.0.0.1:9091", &format!("127.0.0.1:{admin}"));
    assert_ne!(
        script, written,
        "the block names the ports and the binary as expected"
    );
    let out = bash(dir.path(), &script, &[], Duration::from_secs(120));
    // Each call prints its status last; the block's comments say which.
    let promised: Vec<&str> = written
        .lines()
        .filter(|l| l.contains("%{http_code}"))
        .map(|l| l.rsplit("# ").next().unwrap().trim())
        .collect();
    let got: Vec<&str> = out
        .lines()
        .filter_map(|l| {
            l.rsplit(' ')
                .next()
                .filter(|c| c.len() == 3 && c.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    assert_eq!(got, promised, "{out}");
    assert!(out.contains(r#""code":"plan_restricted""#), "{out}");
    assert!(out.contains("{} 200"), "{out}");
    let reload = out
        .lines()
        .find(|l| l.contains("reloaded"))
        .unwrap_or_default();
    assert!(reload.starts_with(r#"{"file":"gateway.yaml""#), "{out}");
    // The metric lines the README shows, exactly.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for line in out
        .lines()
        .filter(|l| l.starts_with("tollgate_requests_total"))
    {
        assert!(
            readme.contains(&format!("\n{line}\n")),
            "the README shows `{line}`"
        );
    }
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("tollgate_requests_total"))
            .count(),
        2,
        "{out}"
    );
}

#[test]
fn the_blocked_address_example_does_what_it_prints() {
    if crate::harness::curl_missing("the_blocked_address_example_does_what_it_prints") {
        return;
    }
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(
        &config_for(&up)
            .auth_failures(20, 60, 300)
            .admin_token("the-admin-token")
            .server(|s| s.trusted_proxies = vec!["127.0.0.1/32".into()]),
    );
    // The example's address, behind a trusted proxy: twenty wrong keys.
    for _ in 0..20 {
        let r = send_raw(
            gw.addr,
            b"GET /v2/client/getState HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer wrong\r\n\
              X-Forwarded-For: 203.0.113.7\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 401);
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".curlrc"), "max-time = 10\n").unwrap();
    let written = block("docs/operations.md", "### Blocked addresses");
    let admin = gw.config.process.admin_listen.to_string();
    let script = written.replace("127.0.0.1:9091", &admin);
    let out = bash(
        dir.path(),
        &script,
        &[("ADMIN_TOKEN", "the-admin-token")],
        Duration::from_secs(60),
    );
    // The listing is the one the doc shows, but for the instants.
    let shown: serde_json::Value = serde_json::from_str(
        written
            .lines()
            .find_map(|l| l.strip_prefix("# {"))
            .map(|rest| format!("{{{rest}"))
            .as_deref()
            .unwrap(),
    )
    .unwrap();
    let mut listed: serde_json::Value =
        serde_json::from_str(out.lines().next().unwrap_or_default()).unwrap();
    let row = &mut listed["blocks"][0];
    for at in ["since", "until"] {
        let v = row[at].as_str().unwrap();
        assert!(v.len() == 20 && v.ends_with('Z'), "{at}: {v}");
        row[at] = shown["blocks"][0][at].clone();
    }
    assert_eq!(listed, shown);
    // Released: nothing listed, and the address is served again.
    let r = crate::harness::admin_with(
        gw.config.process.admin_listen,
        "GET",
        "/api/blocks",
        Some("the-admin-token"),
    );
    assert_eq!(r.json()["blocks"], serde_json::json!([]));
}

#[test]
fn the_leaked_key_example_does_what_it_prints() {
    if crate::harness::curl_missing("the_leaked_key_example_does_what_it_prints") {
        return;
    }
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(
        &config_for(&up)
            .add_key("shop-42", "shop42-key-found-in-a-public-repo", "basic")
            .admin_token("the-admin-token"),
    );
    assert_eq!(
        gw.call(
            "shop42-key-found-in-a-public-repo",
            "GET",
            "/v2/client/getStatus",
            ""
        )
        .status,
        200
    );
    run_operations_example(&gw, "### Revoking a leaked key");
}

/// Run the sh block after `heading` in docs/operations.md against `gw` (its ports in place of
/// the defaults, `$ADMIN_TOKEN` set to `the-admin-token`): each command prints what the
/// comment under it says.
fn run_operations_example(gw: &Gateway, heading: &str) {
    run_operations_examples(gw, &[heading]);
}

/// [`run_operations_example`] for the blocks after `headings`, one after the other in one
/// shell (a later one may use what an earlier one set), with this build's `tollgate` first
/// on `PATH`.
fn run_operations_examples(gw: &Gateway, headings: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".curlrc"), "max-time = 10\n").unwrap();
    let written: String = headings
        .iter()
        .map(|h| block("docs/operations.md", h))
        .collect();
    let bin = Path::new(env!("CARGO_BIN_EXE_tollgate")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = written
        .replace(
            "127.0.0.1:9091",
            &gw.config.process.admin_listen.to_string(),
        )
        .replace("127.0.0.1:8080", &gw.addr.to_string());
    let out = bash(
        dir.path(),
        &script,
        &[("ADMIN_TOKEN", "the-admin-token"), ("PATH", &path)],
        Duration::from_secs(60),
    );
    let shown: Vec<&str> = written
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .collect();
    let printed: Vec<&str> = out.lines().collect();
    assert_eq!(printed, shown, "{out}");
}

#[test]
fn the_sign_up_rotation_and_leak_examples_do_what_they_print() {
    if crate::harness::curl_missing("the_sign_up_rotation_and_leak_examples_do_what_they_print") {
        return;
    }
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).admin_token("the-admin-token"));
    run_operations_examples(
        &gw,
        &[
            "#### Signing up a customer",
            "#### Rotating a key and answering a leak",
        ],
    );
}

#[test]
fn the_quota_and_ledger_example_does_what_it_prints() {
    if crate::harness::curl_missing("the_quota_and_ledger_example_does_what_it_prints") {
        return;
    }
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(
        &config_for(&up)
            .add_key("shop-42", "shop42-key", "basic")
            .plan_quota("basic", 2, "day")
            .ledger(400)
            .admin_token("the-admin-token"),
    );
    run_operations_example(&gw, "### A key's quota and its ledger");
}

/// `curl` commands in a doc: lines of its code blocks that run curl, and inline spans that
/// start with it. (file, line number, text).
fn curl_lines(file: &str) -> Vec<(String, usize, String)> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let mut fenced = false;
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let runs = |s: &str| {
            s.split(|c: char| c.is_whitespace() || matches!(c, ';' | '|' | '(' | '&'))
                .any(|w| w == "curl")
        };
        if fenced {
            if runs(line.split(" # ").next().unwrap_or(line)) && !line.trim_start().starts_with('#')
            {
                found.push((file.to_string(), i + 1, line.trim().to_string()));
            }
        } else {
            for (n, span) in line.split('`').enumerate() {
                if n % 2 == 1 && span.starts_with("curl ") {
                    found.push((file.to_string(), i + 1, span.to_string()));
                }
            }
        }
    }
    found
}

#[test]
fn every_curl_line_in_the_docs_is_in_an_example_a_test_runs() {
    let mut docs = vec!["README.md".to_string(), "deploy/README.md".to_string()];
    for dir in ["docs", "docs/benchmarks"] {
        for e in std::fs::read_dir(repo().join(dir)).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".md") {
                docs.push(format!("{dir}/{name}"));
            }
        }
    }
    let run: Vec<String> = RUN
        .iter()
        .flat_map(|(f, h)| {
            block(f, h)
                .lines()
                .map(|l| l.trim().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let mut stray = Vec::new();
    for doc in &docs {
        for (file, line, text) in curl_lines(doc) {
            if !run.iter().any(|r| r.contains(&text)) {
                stray.push(format!("{file}:{line}: {text}"));
            }
        }
    }
    let mut msg = Vec::new();
    writeln!(
        msg,
        "curl lines that no test runs (put them in a block of {RUN:?}, or run them in a test):"
    )
    .unwrap();
    for s in &stray {
        writeln!(msg, "  {s}").unwrap();
    }
    assert!(stray.is_empty(), "{}", String::from_utf8(msg).unwrap());
    // The runner itself finds what it must: a line in prose and one in a block.
    assert!(curl_lines("README.md").len() >= 5);
}
