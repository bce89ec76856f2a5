//! `tollgate check` and `tollgate hash-key` as an operator runs them: every broken config in
//! `policies/invalid/` is refused with exactly the message in its paired `.expected` file and
//! exit status 1 (`crates/core/tests/policies.rs` checks the same messages through the library).

use std::path::{Path, PathBuf};
use std::process::Command;

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| Path::new(dir).join(p.file_name().unwrap()))
        .collect();
    v.sort();
    v
}

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

#[test]
fn check_refuses_what_run_refuses_a_published_demo_key_and_an_upstream_that_does_not_resolve() {
    // As `run`: refused without --allow-demo-keys, naming the file, the line and the field.
    let out = tollgate()
        .args(["check", "--config", "policies/demo.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "run refuses it");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("policies/demo.yaml:")
            && stderr.contains("holds a published demo key")
            && stderr.contains("--allow-demo-keys"),
        "{stderr}"
    );
    // An upstream host that does not resolve: refused (as `nginx -t` does), unless the check
    // runs elsewhere than the gateway (`--no-resolve`).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.yaml");
    tollgate_core::testing::TestConfig::new()
        .upstream("http://no-such-host.invalid:9")
        .write(&path);
    let out = tollgate()
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("field `upstream`") && stderr.contains("no-such-host.invalid"),
        "{stderr}"
    );
    let out = tollgate()
        .args(["check", "--no-resolve", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_is_loud_about_a_published_demo_key() {
    let out = tollgate()
        .args([
            "check",
            "--allow-demo-keys",
            "--config",
            "policies/demo.yaml",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "a valid config, allowed as run allows it"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    for text in [&stdout, &stderr] {
        assert!(
            text.contains(
                "!!! PUBLISHED DEMO KEYS in partners[0], keys[0], keys[1], keys[2], keys[3]"
            ),
            "{text}"
        );
    }
    assert!(
        stdout.contains(
            "policies/demo.yaml:47: field `keys[0]`: PUBLISHED DEMO KEY: this is `demo-basic-key`"
        ),
        "{stdout}"
    );
}

#[test]
fn check_prints_a_summary_for_a_good_config() {
    let out = tollgate()
        .args(["check", "--no-resolve", "--config", "policies/gateway.yaml"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "policies/gateway.yaml: OK",
        "basic      plan_id 1      40 requests / 10 s   allow: send_message, send_group",
        "standard   plan_id 2      70 requests / 10 s   allow: all",
        "pro        plan_id 3     150 requests / 10 s   allow: all",
        "keys          3 customer (1 managed by a partner), 1 partner",
        "send_group_event         POST    /v2/sendGroup ",
        "*settings_get ",
        "upstream pool 128 connections; 1 accept loop per listener (run --conf replaces it)",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

/// The `runtime` block sets the gateway's threads without a Pingora settings file: three
/// worker threads of the gateway's service (named after it, beside the main thread), a
/// single-threaded runtime each; `--conf` replaces the block.
#[test]
fn the_runtime_block_sets_the_gateways_threads_and_conf_replaces_it() {
    use crate::harness::{config_for, Mode, Process, Upstream};
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let workers = |p: &Process| {
        let pid = p.pid();
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|t| {
                let t = t.ok()?.path();
                let tid: u32 = t.file_name()?.to_str()?.parse().ok()?;
                let comm = std::fs::read_to_string(t.join("comm")).ok()?;
                (tid != pid && comm.trim() == "tollgate").then_some(tid)
            })
            .count()
    };
    let config = config_for(&up).runtime(|r| r.threads = 3);
    let (p, listen, _) = Process::run(dir.path(), "rt", &config);
    assert_eq!(workers(&p), 3);
    let r = crate::harness::send_raw(
        listen,
        b"GET /v2/client/getStatus HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer pro-key-1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
    drop(p);
    // A Pingora settings file of one thread wins over the block.
    let conf = dir.path().join("pingora.yaml");
    std::fs::write(&conf, "---\nversion: 1\nthreads: 1\n").unwrap();
    let path = dir.path().join("rt.yaml");
    let p = Process::spawn(
        dir.path(),
        "rt2",
        &[
            "run",
            "--config",
            path.to_str().unwrap(),
            "--conf",
            conf.to_str().unwrap(),
        ],
        &[("TOLLGATE_LOG", "info")],
    );
    crate::harness::wait_ready(config.file.admin_listen.parse().unwrap(), 200);
    assert_eq!(workers(&p), 1);
}

#[test]
fn check_exits_non_zero_with_the_precise_error() {
    for path in files("policies/invalid", "yaml") {
        let out = tollgate()
            .arg("check")
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", path.display());
        let want = std::fs::read_to_string(path.with_extension("expected")).unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.trim_end(), format!("error: {}", want.trim_end()));
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn check_reports_a_missing_file() {
    let out = tollgate()
        .args(["check", "--config", "policies/no-such.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with("error: policies/no-such.yaml: cannot read"),
        "{stderr}"
    );
}

#[test]
fn check_warns_about_plain_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.yaml");
    std::fs::write(&path, tollgate_core::testing::CONFIG_YAML).unwrap();
    let out = tollgate()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("warnings"), "{text}");
    assert!(
        text.contains("field `keys[0].key`: a plain key sits in the config file"),
        "{text}"
    );
    // The key itself is never echoed.
    assert!(!text.contains("basic-key-1"), "{text}");
}

fn hash_key(stdin: &[u8]) -> (Option<i32>, String, String) {
    use std::io::Write;
    let mut child = tollgate()
        .arg("hash-key")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn hash_key_prints_the_sha256_of_stdin_without_one_trailing_newline() {
    // printf %s demo-basic-key | sha256sum
    let digest = "4f6d8d54023de38a3bc2ca891c396e12d7cf000a3c5dbd9c2c1c73ef9b4f1c9b\n";
    assert_eq!(
        hash_key(b"demo-basic-key\n"),
        (Some(0), digest.into(), String::new())
    );
    assert_eq!(
        hash_key(b"demo-basic-key"),
        (Some(0), digest.into(), String::new())
    );
    assert_eq!(hash_key(b"demo-basic-key\r\n").1, digest);
    // Only one newline is stripped: what remains is not a usable token.
    let (code, out, err) = hash_key(b"demo-basic-key\n\n");
    assert_eq!((code, out.as_str()), (Some(1), ""));
    assert!(err.contains("cannot be sent as a bearer token"), "{err}");
    assert_eq!(hash_key(b"").0, Some(1));
}

/// `tollgate keys --admin <a> args…` with `TOLLGATE_ADMIN_TOKEN` set to `token` and `stdin`:
/// (exit code, stdout, stderr).
fn keys(a: std::net::SocketAddr, token: &str, args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write as _;
    let admin = format!("http://{a}");
    let mut child = tollgate()
        .args(["keys", "--admin", &admin])
        .args(args)
        .env("TOLLGATE_ADMIN_TOKEN", token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_keys_command_drives_a_running_gateway_through_its_admin_api() {
    use crate::harness::{config_for, Gateway, Mode, Upstream};
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).admin_token("keys-cli-token"));
    let a = gw.config.process.admin_listen;
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let (code, out, err) = keys(a, "keys-cli-token", &all, "");
        assert_eq!(code, 0, "{args:?}: {err}");
        serde_json::from_str(&out).unwrap()
    };
    // A table by default: a header and one row.
    let (code, out, _) = keys(a, "keys-cli-token", &["show", "basic-1"], "");
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("NAME") && lines[1].starts_with("basic-1 "),
        "{out}"
    );
    assert!(
        lines[1].contains("active") && lines[1].contains("config"),
        "{out}"
    );
    // --json: the API's own answer.
    assert_eq!(json(&["show", "basic-1"])["requests_per_window"], 40);
    // Every verb the API has, and what it changed.
    assert_eq!(
        json(&["suspend", "basic-1", "--reason", "late invoices"])["state"],
        "suspended"
    );
    let listed = json(&["list", "--state", "suspended"]);
    assert_eq!(listed["keys"].as_array().unwrap().len(), 1);
    assert_eq!(listed["keys"][0]["name"], "basic-1");
    assert_eq!(json(&["resume", "basic-1"])["state"], "active");
    assert_eq!(json(&["limit", "basic-1", "5"])["requests_per_window"], 5);
    assert_eq!(
        json(&["limit", "basic-1", "--clear"])["requests_per_window"],
        40
    );
    let q = json(&["quota", "basic-1", "100/day"]);
    assert_eq!(
        (q["quota"]["requests"].clone(), q["quota"]["per"].clone()),
        (100.into(), "day".into())
    );
    assert_eq!(
        json(&["quota", "basic-1", "--clear"])["quota"],
        serde_json::Value::Null
    );
    let all = json(&["list"]);
    assert_eq!(all["keys"].as_array().unwrap().len(), 7, "every page");
    assert_eq!(all["keys"][0]["name"], "acme", "in name order");
    // The leak path: the secret on stdin, never on the command line.
    let (code, out, err) = keys(a, "keys-cli-token", &["revoke-secret"], "standard-key-1\n");
    assert_eq!((code, out.as_str()), (0, "revoked standard-1\n"), "{err}");
    assert_eq!(json(&["show", "standard-1"])["state"], "revoked");
    // Issued keys: create (the secret printed once), rotate, delete.
    let (code, out, err) = keys(
        a,
        "keys-cli-token",
        &[
            "create",
            "shop-7",
            "--plan",
            "pro",
            "--quota",
            "50/day",
            "--requests-per-window",
            "9",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let secret = out
        .lines()
        .find_map(|l| l.strip_prefix("key: "))
        .expect("the secret, once")
        .to_string();
    assert!(out.contains("shop-7") && out.contains("api"), "{out}");
    assert_eq!(
        gw.call(&secret, "GET", "/v2/client/getStatus", "").status,
        200
    );
    let c = json(&[
        "create",
        "shop-8",
        "--plan",
        "basic",
        "--sha256",
        &"ab".repeat(32),
    ]);
    assert_eq!((c["source"].as_str(), c.get("key")), (Some("api"), None));
    let r = json(&["rotate", "shop-7", "--overlap", "0"]);
    let rotated = r["key"].as_str().unwrap();
    assert_eq!(
        gw.call(rotated, "GET", "/v2/client/getStatus", "").status,
        200
    );
    assert_eq!(
        gw.call(&secret, "GET", "/v2/client/getStatus", "").status,
        401
    );
    let listed = json(&["list", "--source", "api"]);
    assert_eq!(listed["keys"].as_array().unwrap().len(), 2);
    let (code, out, _) = keys(a, "keys-cli-token", &["delete", "shop-8"], "");
    assert_eq!((code, out.as_str()), (0, "deleted shop-8\n"));
    let (code, _, err) = keys(a, "keys-cli-token", &["delete", "basic-1"], "");
    assert_eq!(code, 1);
    assert!(err.contains("defined in the config"), "{err}");
    let (code, _, err) = keys(
        a,
        "keys-cli-token",
        &["create", "shop-7", "--plan", "pro"],
        "",
    );
    assert_eq!(code, 1);
    assert!(err.contains("exists"), "{err}");
    // The API answers a deletion 204 with no body: `--json` prints nothing.
    let (code, out, _) = keys(a, "keys-cli-token", &["--json", "delete", "shop-7"], "");
    assert_eq!((code, out.as_str()), (0, ""));
    // Failures: exit 1 and the problem's detail on stderr.
    let (code, _, err) = keys(a, "keys-cli-token", &["show", "nobody"], "");
    assert_eq!(code, 1);
    assert!(err.contains("nobody"), "{err}");
    let (code, _, err) = keys(a, "wrong-token", &["show", "basic-1"], "");
    assert_eq!(code, 1);
    assert!(err.starts_with("error: "), "{err}");
    let (code, _, err) = keys(a, "keys-cli-token", &["list", "--plan", "gold"], "");
    assert_eq!(code, 1);
    assert!(err.contains("`plan`"), "{err}");
    // An admin listener that is not there: said, exit 1.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, _, err) = keys(gone, "t", &["show", "basic-1"], "");
    assert_eq!(code, 1);
    assert!(err.contains("cannot reach the admin listener"), "{err}");
    // A command line it cannot read is a failure too: exit 1, what is wrong on stderr (help
    // exits 0).
    for args in [
        &["create", "shop-9", "--plan", "pro", "--quota", "5/week"][..],
        &["rotate", "shop-7", "--overlap", "-1"],
        &["frobnicate"],
        &[],
    ] {
        let (code, out, err) = keys(a, "keys-cli-token", args, "");
        assert_eq!((code, out.as_str()), (1, ""), "{args:?}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
    }
    let (code, out, _) = keys(a, "keys-cli-token", &["create", "--help"], "");
    assert_eq!(code, 0);
    assert!(out.contains("--plan"), "{out}");
}
