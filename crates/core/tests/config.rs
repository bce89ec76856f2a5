//! Config loading beyond the golden files: environment keys, relative paths, base URLs, TLS
//! files, warnings, and error positions.

use std::collections::HashMap;
use std::path::Path;

use tollgate_core::config::{Config, ConfigError, Env, Scheme};
use tollgate_core::testing::NoEnv;

struct MapEnv(HashMap<&'static str, &'static str>);

impl Env for MapEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|v| v.to_string())
    }
}

/// A minimal config: an upstream and one plan. Line 2 is the upstream.
const BASE: &str = r#"
upstream: { base_url: "https://api.example.com" }
plans:
  basic: { plan_id: 1, requests_per_window: 40, allow: [send_message] }
"#;

/// [`BASE`] with `upstream` as its upstream block (still on line 2).
fn with_upstream(upstream: &str) -> String {
    format!(
        "\nupstream: {upstream}\nplans:\n  basic: {{ plan_id: 1, requests_per_window: 40, allow: [send_message] }}\n"
    )
}

fn parse(extra: &str) -> Result<Config, ConfigError> {
    Config::parse(&format!("{BASE}{extra}"), Path::new("t.yaml"), &NoEnv)
}

#[test]
fn defaults_fill_what_the_file_leaves_out() {
    let c = parse("").unwrap();
    assert_eq!(c.process.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.process.admin_listen.to_string(), "127.0.0.1:9091");
    assert_eq!(c.limits.window.get(), 10);
    assert_eq!(c.limits.max_body_bytes.get(), 16 * 1024 * 1024);
    assert_eq!(c.limits.max_validated_body_bytes.get(), 64 * 1024);
    assert_eq!(c.partner_limit.get(), 150);
    assert_eq!(c.upstream.connect_timeout.as_millis(), 2000);
    assert_eq!(c.upstream.read_timeout.as_millis(), 30000);
    assert_eq!(c.upstream.ca_file, None);
    assert_eq!(c.process.tls, None);
    assert_eq!(c.routes_file, None);
    assert_eq!(c.process.log_format, tollgate_core::config::LogFormat::Text);
    let sd = c.process.shutdown;
    assert_eq!(
        (sd.drain_seconds, sd.grace_seconds, sd.timeout_seconds),
        (0, 10, 5)
    );
}

#[test]
fn key_env_reads_the_environment() {
    let text = format!("{BASE}keys:\n  - {{ name: k, key_env: SHOP_KEY, plan: basic }}\n");
    let env = MapEnv(HashMap::from([("SHOP_KEY", "s3cr3t-key")]));
    let c = Config::parse(&text, Path::new("t.yaml"), &env).unwrap();
    assert_eq!(
        c.keys[0].digest,
        tollgate_core::testing::digest("s3cr3t-key")
    );
    assert!(c.warnings.is_empty());

    let bad = MapEnv(HashMap::from([("SHOP_KEY", "has space")]));
    let e = Config::parse(&text, Path::new("t.yaml"), &bad).unwrap_err();
    assert_eq!(e.field, "keys[0].key_env");
    assert!(
        !e.to_string().contains("has space"),
        "the value must not be echoed: {e}"
    );
}

#[test]
fn plain_keys_load_with_a_warning_that_names_the_line() {
    let c = parse("keys:\n  - name: k\n    key: plain-1\n    plan: basic\n").unwrap();
    assert_eq!(c.keys[0].digest, tollgate_core::testing::digest("plain-1"));
    assert_eq!(c.warnings.len(), 1);
    assert_eq!(c.warnings[0].field, "keys[0].key");
    assert_eq!(c.warnings[0].line, Some(7));
}

#[test]
fn base_url_keeps_port_and_path() {
    let text = with_upstream(r#"{ base_url: "http://127.0.0.1:8081/gateway/" }"#);
    let c = Config::parse(&text, Path::new("t.yaml"), &NoEnv).unwrap();
    let u = &c.upstream;
    assert_eq!(
        (u.scheme, u.host.as_str(), u.port),
        (Scheme::Http, "127.0.0.1", 8081)
    );
    assert_eq!(
        (u.authority.as_str(), u.base_path.as_str()),
        ("127.0.0.1:8081", "/gateway")
    );
    let c = parse("").unwrap();
    assert_eq!((c.upstream.port, c.upstream.base_path.as_str()), (443, ""));
}

#[test]
fn base_url_refusals() {
    for url in [
        "ftp://x",
        "api.example.com",
        "https://user:pw@api.example.com",
        "https://api.example.com/?a=b",
        "",
    ] {
        let text = with_upstream(&format!("{{ base_url: \"{url}\" }}"));
        let e = Config::parse(&text, Path::new("t.yaml"), &NoEnv).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.line),
            ("upstream.base_url", Some(2)),
            "{url}: {e}"
        );
    }
}

#[test]
fn relative_paths_resolve_against_the_config_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tls")).unwrap();
    std::fs::write(dir.path().join("tls/cert.pem"), "x").unwrap();
    std::fs::write(dir.path().join("tls/key.pem"), "x").unwrap();
    std::fs::write(
        dir.path().join("routes.yaml"),
        tollgate_core::config::routes::BUILTIN_CATALOGUE,
    )
    .unwrap();
    let text = format!(
        "{BASE}routes: routes.yaml\ntls: {{ listen: \"127.0.0.1:8443\", cert_file: tls/cert.pem, key_file: tls/key.pem }}\n"
    );
    let path = dir.path().join("gw.yaml");
    std::fs::write(&path, &text).unwrap();
    let c = Config::load(&path).unwrap();
    assert_eq!(
        c.routes_file.as_deref(),
        Some(dir.path().join("routes.yaml").as_path())
    );
    assert_eq!(
        c.process.tls.unwrap().cert_file,
        dir.path().join("tls/cert.pem")
    );

    std::fs::remove_file(dir.path().join("tls/key.pem")).unwrap();
    let e = Config::load(&path).unwrap_err();
    assert_eq!(e.field, "tls.key_file");
    assert_eq!(e.line, Some(6));
}

#[test]
fn ca_file_only_for_https() {
    let text = with_upstream(r#"{ base_url: "http://api.example.com", ca_file: ca.pem }"#);
    let e = Config::parse(&text, Path::new("t.yaml"), &NoEnv).unwrap_err();
    assert_eq!(e.field, "upstream.ca_file");
}

#[test]
fn limits_have_upper_bounds_too() {
    let e = parse("limits: { window_seconds: 100000 }\n").unwrap_err();
    assert_eq!(e.field, "limits.window_seconds");
    let e = parse("partner_requests_per_window: 2000000\n").unwrap_err();
    assert!(e.message.contains("above the maximum"), "{e}");
}

#[test]
fn names_must_be_label_safe() {
    let e = parse("keys:\n  - { name: \"a b\", sha256: \"2222222222222222222222222222222222222222222222222222222222222222\", plan: basic }\n")
        .unwrap_err();
    assert_eq!(e.field, "keys[0].name");
    // A plan name that a metric label would have to quote.
    let mut c = tollgate_core::testing::TestConfig::new();
    let basic = c.file.plans.shift_remove("basic").unwrap();
    c.file.plans.insert("ba\"sic".into(), basic);
    let e = c.try_parse().unwrap_err();
    assert_eq!(e.field, "plans.ba\"sic", "{e}");
    assert!(e.message.contains("not a valid name"), "{e}");
}

/// A name is a segment of the admin API's paths (`/api/keys/{name}`): `.` and `..`, which
/// clients remove from a path before sending it, name nothing; other dotted names do.
#[test]
fn a_name_is_never_a_dot_segment() {
    use tollgate_core::config::is_valid_name;
    for name in [".", ".."] {
        assert!(!is_valid_name(name), "{name}");
        let e = parse(&format!("keys:\n  - {{ name: \"{name}\", sha256: \"2222222222222222222222222222222222222222222222222222222222222222\", plan: basic }}\n"))
            .unwrap_err();
        assert_eq!(e.field, "keys[0].name", "{name}");
        assert!(e.message.contains("not `.` or `..`"), "{e}");
    }
    for name in ["...", ".a", "a..", "v1.2", "-", "_"] {
        assert!(is_valid_name(name), "{name}");
    }
}

#[test]
fn duplicate_yaml_keys_are_refused() {
    let e = parse("listen: \"0.0.0.0:1\"\nlisten: \"0.0.0.0:2\"\n").unwrap_err();
    assert!(e.message.contains("duplicate"), "{e}");
    assert!(e.line.is_some());
}

/// A field given twice is named, at its second line: at the top level (serde_yaml locates
/// the map that holds it, the file's line 1) and in a block below.
#[test]
fn a_field_given_twice_is_named_at_its_second_line() {
    let base = BASE.lines().count();
    let e = parse("log: { format: json }\n# again\nlog: { format: text }\n").unwrap_err();
    assert_eq!((e.field.as_str(), e.line), ("log", Some(base + 3)), "{e}");
    let e = parse("server:\n  idle_timeout_seconds: 5\n\n  idle_timeout_seconds: 6\n").unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.line),
        ("server.idle_timeout_seconds", Some(base + 4)),
        "{e}"
    );
}

#[test]
fn log_format_is_text_or_json() {
    assert!(parse("log: { format: json }\n").is_ok());
    assert_eq!(
        parse("log: { format: xml }\n").unwrap_err().field,
        "log.format"
    );
}
