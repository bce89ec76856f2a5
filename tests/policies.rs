//! Golden test: every config shipped in `policies/` loads, and every broken one in
//! `policies/invalid/` is refused with exactly the message in its paired `.expected` file —
//! through the library and through `tollgate check`.

use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate::config::routes::Catalogue;
use tollgate::config::Config;

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
fn every_shipped_config_loads_without_a_warning() {
    let configs: Vec<_> = files("policies", "yaml")
        .into_iter()
        .filter(|p| !p.ends_with("routes.yaml"))
        .collect();
    assert!(
        configs.iter().any(|p| p.ends_with("gateway.yaml"))
            && configs.iter().any(|p| p.ends_with("demo.yaml")),
        "{configs:?}"
    );
    for path in configs {
        let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        // A plain key in a shipped file would teach operators to keep keys in configs. The
        // demo's own policies hold its published keys, and say so; no other file holds one.
        let (published, others): (Vec<_>, Vec<_>) = cfg
            .warnings
            .iter()
            .partition(|w| cfg.published_keys.contains(&w.field));
        assert_eq!(
            others,
            Vec::<&tollgate::config::Warning>::new(),
            "{}",
            path.display()
        );
        let demo = path.ends_with("demo.yaml") || path.ends_with("cluster.yaml");
        let entries = if demo {
            cfg.keys.len() + cfg.partners.len()
        } else {
            0
        };
        assert_eq!(published.len(), entries, "{}", path.display());
    }
}

#[test]
fn check_is_loud_about_a_published_demo_key() {
    let out = tollgate()
        .args(["check", "--config", "policies/demo.yaml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "a valid config");
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
fn the_catalogue_has_the_contract_routes_with_their_spec_paths() {
    use tollgate::config::routes::{Family, MethodSel, PathMatch};
    let c = Catalogue::builtin();
    let shipped: tollgate::config::file::FileCatalogue =
        serde_yaml::from_str(&std::fs::read_to_string("policies/routes.yaml").unwrap()).unwrap();
    assert_eq!(
        c.routes().len(),
        shipped.routes.len() + 1,
        "the built-in catalogue is the shipped file, plus `unknown`"
    );
    let exact = |p: &str| PathMatch::Exact(p.into());
    let post = MethodSel::One("POST".into());
    for (id, method, path, family) in [
        (
            "send_message",
            post.clone(),
            exact("/v2/sendMessage/"),
            Family::Customer,
        ),
        (
            "send_group",
            post.clone(),
            exact("/v2/sendGroup/"),
            Family::Customer,
        ),
        (
            "send_group_event",
            post.clone(),
            exact("/v2/sendGroup"),
            Family::Customer,
        ),
        (
            "group_list",
            MethodSel::One("GET".into()),
            exact("/v2/groupChat/getGroupList/"),
            Family::Customer,
        ),
        (
            "client",
            MethodSel::Any,
            PathMatch::Prefix("/v2/client/".into()),
            Family::Customer,
        ),
        (
            "webhook_set",
            post.clone(),
            exact("/v2/settings/webhook/set"),
            Family::Customer,
        ),
        (
            "service_upgrade",
            post.clone(),
            exact("/v2/service/upgrade"),
            Family::Partner,
        ),
    ] {
        let r = c.get(c.find(id).unwrap_or_else(|| panic!("no route {id}")));
        assert_eq!(
            (&r.method, &r.path, r.family),
            (&method, &path, family),
            "{id}"
        );
        assert!(!r.assumed, "{id} has its path in the spec");
    }
}

#[test]
fn gateway_yaml_has_the_plans_of_the_spec() {
    let cfg = Config::load(Path::new("policies/gateway.yaml")).unwrap();
    let plans: Vec<_> = cfg
        .plans
        .iter()
        .map(|p| (p.name.as_str(), p.plan_id, p.limit.get()))
        .collect();
    assert_eq!(
        plans,
        [("basic", 1, 40), ("standard", 2, 70), ("pro", 3, 150)]
    );
    assert_eq!(cfg.limits.window.get(), 10);
    let basic = cfg.plan("basic").unwrap();
    let tollgate::config::Allow::Only(ids) = &basic.allow else {
        panic!("basic must be a list")
    };
    let mut ids: Vec<_> = ids
        .iter()
        .map(|&i| cfg.catalogue.get(i).id.as_str())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "client",
            "group_list",
            "history_pendings",
            "history_sent_list",
            "history_sent_status",
            "send_group",
            "send_group_event",
            "send_message",
            "settings_country_codes",
            "settings_get"
        ]
    );
}

#[test]
fn every_invalid_config_is_refused_with_its_paired_message() {
    let configs = files("policies/invalid", "yaml");
    let expected = files("policies/invalid", "expected");
    assert_eq!(
        configs.len(),
        expected.len(),
        "each .yaml needs a .expected and the reverse"
    );
    assert!(configs.len() >= 20);
    for path in configs {
        let want_file = path.with_extension("expected");
        let want = std::fs::read_to_string(&want_file)
            .unwrap_or_else(|_| panic!("{} has no .expected", path.display()));
        let want = want.trim_end();
        let err = Config::load(&path).expect_err(&path.display().to_string());
        assert_eq!(err.to_string(), want);
        assert!(err.line.is_some(), "{}: no line", path.display());
    }
}

#[test]
fn check_prints_a_summary_for_a_good_config() {
    let out = tollgate()
        .args(["check", "--config", "policies/gateway.yaml"])
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
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
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
