//! The deployment artifacts under `deploy/`: every YAML and JSON file parses, the pieces agree
//! with each other (ports, probes, shutdown timings, Secret wiring, PID file), the systemd unit
//! keeps its hardening, the Kubernetes config is accepted by the real config loader, and the
//! alerts and dashboard name only metrics the gateway exports.
//!
//! External validators (promtool, systemd-analyze, shellcheck) run from
//! `scripts/validate-deploy.sh`; this test needs nothing beyond the crate's own dependencies.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value;
use tollgate::config::{Config, Env};

/// The metrics the gateway exports (see `src/runtime/metrics.rs`, `src/shared/metrics.rs` for
/// the `tollgate_cluster_…` ones, registered when the config has a `cluster:` block, and
/// `src/traces/export.rs` for the `tollgate_spans_…` ones, registered with a `tracing:` block).
const METRICS: &[&str] = &[
    "tollgate_requests_total",
    "tollgate_responses_total",
    "tollgate_request_duration_seconds",
    "tollgate_upstream_duration_seconds",
    "tollgate_config_reloads_total",
    "tollgate_keys",
    "tollgate_build_info",
    "tollgate_cluster_store_up",
    "tollgate_cluster_replicas",
    "tollgate_cluster_sync_seconds",
    "tollgate_cluster_sync_keys",
    "tollgate_cluster_redis_calls_total",
    "tollgate_cluster_sync_errors_total",
    "tollgate_cluster_parked_total",
    "tollgate_cluster_settle_wait_seconds",
    "tollgate_connections",
    "tollgate_connections_refused_total",
    "tollgate_auth_blocked_ips",
    "tollgate_plan_overrides",
    "tollgate_key_refusals_total",
    "tollgate_admin_changes_total",
    "tollgate_quota_exhausted_keys",
    "tollgate_spans_exported_total",
    "tollgate_spans_dropped_total",
];

/// The values each fixed label can take; route and plan values come from the config.
const LABEL_VALUES: &[(&str, &[&str])] = &[
    (
        "outcome",
        &[
            "forwarded",
            "unauthorized",
            "forbidden",
            "rate_limited",
            "invalid",
            "not_found",
            "upstream_error",
            "blocked",
            "shadow_rate_limited",
            "shadow_forbidden",
            "timeout",
            "quota_exhausted",
            "shadow_quota_exhausted",
        ],
    ),
    (
        "reason",
        &[
            "max_connections",
            "max_connections_per_ip",
            "unknown",
            "expired",
            "suspended",
            "revoked",
        ],
    ),
    ("listener", &["http", "tls"]),
    ("class", &["1xx", "2xx", "3xx", "4xx", "5xx"]),
    ("result", &["success", "error", "applied", "refused"]),
    ("state", &["active", "expired", "suspended", "revoked"]),
    (
        "action",
        &[
            "suspend",
            "resume",
            "revoke",
            "limit",
            "quota",
            "upgrade",
            "partner_suspend",
            "partner_resume",
            "partner_delete",
        ],
    ),
];

/// The artifacts operators are pointed at; losing one should fail loudly.
const EXPECTED_FILES: &[&str] = &[
    "README.md",
    "systemd/tollgate.service",
    "systemd/pingora.yaml",
    "systemd/upgrade.sh",
    "docker/Dockerfile",
    "docker/Dockerfile.dockerignore",
    "k8s/namespace.yaml",
    "k8s/configmap.yaml",
    "k8s/secret.yaml",
    "k8s/deployment.yaml",
    "k8s/service.yaml",
    "k8s/networkpolicy.yaml",
    "k8s/podmonitor.yaml",
    "k8s/redis.yaml",
    "k8s/otel-collector.yaml",
    "k8s/kustomization.yaml",
    "otel/collector.yaml",
    "otel/tempo.yaml",
    "otel/grafana-datasources.yaml",
    "otel/compose.yaml",
    "prometheus/prometheus.yml",
    "prometheus/prometheus-kubernetes.yml",
    "prometheus/alerts.yml",
    "prometheus/alerts.test.yml",
    "grafana/tollgate.json",
];

/// Where the systemd unit expects things (and where upgrade.sh looks by default).
const UNIT_CONFIG: &str = "/etc/tollgate/gateway.yaml";
const UNIT_PINGORA_CONF: &str = "/etc/tollgate/pingora.yaml";
const UNIT_BIN: &str = "/usr/local/bin/tollgate";

// ------------------------------------------------------------------------------------------
// Helpers

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deploy() -> PathBuf {
    repo().join("deploy")
}

fn read(rel: &str) -> String {
    let path = deploy().join(rel);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every file under `dir`, recursively, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// All documents of a (possibly multi-document) YAML text; empty documents are dropped.
fn yaml_docs(text: &str, what: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{what}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn yaml(rel: &str) -> Value {
    let mut docs = yaml_docs(&read(rel), rel);
    assert_eq!(docs.len(), 1, "{rel}: expected one YAML document");
    docs.remove(0)
}

/// Follow a path of mapping keys and sequence indexes ("spec.ports.0.port").
fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    let mut cur = v;
    for part in path.split('.') {
        let next = match part.parse::<usize>() {
            Ok(i) => cur.get(i),
            Err(_) => cur.get(part),
        };
        cur = next.unwrap_or_else(|| panic!("no `{path}` (stopped at `{part}`)"));
    }
    cur
}

fn str_at<'a>(v: &'a Value, path: &str) -> &'a str {
    at(v, path)
        .as_str()
        .unwrap_or_else(|| panic!("`{path}` is not a string"))
}

fn u64_at(v: &Value, path: &str) -> u64 {
    at(v, path)
        .as_u64()
        .unwrap_or_else(|| panic!("`{path}` is not an unsigned integer"))
}

fn seq_at<'a>(v: &'a Value, path: &str) -> &'a Vec<Value> {
    at(v, path)
        .as_sequence()
        .unwrap_or_else(|| panic!("`{path}` is not a sequence"))
}

/// Every string anywhere inside a YAML value (keys excluded).
fn yaml_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Sequence(seq) => seq.iter().for_each(|x| yaml_strings(x, out)),
        Value::Mapping(m) => m.values().for_each(|x| yaml_strings(x, out)),
        Value::Tagged(t) => yaml_strings(&t.value, out),
        _ => {}
    }
}

/// Every string anywhere inside a JSON value (keys excluded).
fn json_strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| json_strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| json_strings(x, out)),
        _ => {}
    }
}

/// The Kubernetes objects of deploy/k8s, by (kind, name).
fn k8s_objects() -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for path in files_under(&deploy().join("k8s")) {
        let text = fs::read_to_string(&path).unwrap();
        for doc in yaml_docs(&text, &path.display().to_string()) {
            if doc.get("kind").is_none() || doc.get("metadata").is_none() {
                continue; // kustomization.yaml has no metadata
            }
            let key = (
                str_at(&doc, "kind").to_string(),
                str_at(&doc, "metadata.name").to_string(),
            );
            assert!(
                out.insert(key.clone(), doc).is_none(),
                "{key:?} is defined twice"
            );
        }
    }
    out
}

fn k8s(kind: &str, name: &str) -> Value {
    k8s_objects()
        .remove(&(kind.to_string(), name.to_string()))
        .unwrap_or_else(|| panic!("deploy/k8s has no {kind} {name}"))
}

/// The value of one mapping key, which may itself contain dots (`prometheus.io/port`).
fn key<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string `{k}`"))
}

/// The gateway.yaml embedded in the ConfigMap.
fn configmap_gateway_yaml() -> String {
    key(
        at(&k8s("ConfigMap", "tollgate-config"), "data"),
        "gateway.yaml",
    )
    .to_string()
}

/// drain + grace + timeout of a gateway config's `shutdown:` block, with the loader's defaults.
fn shutdown_total(gateway: &Value) -> u64 {
    let field = |name: &str, default: u64| {
        gateway
            .get("shutdown")
            .and_then(|s| s.get(name))
            .map_or(default, |v| {
                v.as_u64().expect("shutdown fields are integers")
            })
    };
    field("drain_seconds", 0) + field("grace_seconds", 10) + field("timeout_seconds", 5)
}

fn port_of(addr: &str) -> u64 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("`{addr}` has no port"))
}

/// A `key_env` value for every variable: distinct per name and a valid token68.
struct TestEnv;

impl Env for TestEnv {
    fn var(&self, name: &str) -> Option<String> {
        Some(format!("test-{name}"))
    }
}

/// The environment a placeholder Secret would give.
struct SecretEnv(BTreeMap<String, String>);

impl Env for SecretEnv {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

/// A systemd unit file: section -> key -> values in order (a key may repeat).
type Unit = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn parse_unit(text: &str) -> Unit {
    let mut unit = Unit::new();
    let mut section = String::new();
    let mut pending = String::new();
    for raw in text.lines() {
        let line = raw.trim();
        if pending.is_empty() && (line.is_empty() || line.starts_with('#') || line.starts_with(';'))
        {
            continue;
        }
        if let Some(cont) = line.strip_suffix('\\') {
            pending.push_str(cont);
            pending.push(' ');
            continue;
        }
        let line = format!("{pending}{line}");
        pending.clear();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            unit.entry(section.clone()).or_default();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("unit line without `=`: {line}"));
        assert!(!section.is_empty(), "`{line}` before any [section]");
        unit.entry(section.clone())
            .or_default()
            .entry(key.trim().to_string())
            .or_default()
            .push(value.trim().to_string());
    }
    unit
}

fn unit_values<'a>(unit: &'a Unit, section: &str, key: &str) -> &'a [String] {
    unit.get(section)
        .and_then(|s| s.get(key))
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The last value of a key (systemd's rule for single-valued settings).
fn unit_value<'a>(unit: &'a Unit, section: &str, key: &str) -> &'a str {
    unit_values(unit, section, key)
        .last()
        .unwrap_or_else(|| panic!("tollgate.service: [{section}] has no {key}="))
}

/// `tollgate_…` names in `text`, with histogram suffixes stripped.
fn metric_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("tollgate_") {
        let start = from + found;
        from = start + "tollgate_".len();
        let boundary = start == 0 || {
            let b = bytes[start - 1];
            !(b.is_ascii_alphanumeric() || b == b'_')
        };
        if !boundary {
            continue;
        }
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .map_or(text.len(), |i| start + i);
        let mut name = &text[start..end];
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                name = base;
            }
        }
        if name.len() > "tollgate_".len() {
            out.insert(name.to_string());
        }
    }
    out
}

/// Values of `label="…"`, `label=~"…"` and `label!="…"` matchers in PromQL text (alternatives
/// of a regex split on `|`).
fn label_values(expr: &str, label: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut from = 0;
    while let Some(found) = expr[from..].find(label) {
        let start = from + found;
        from = start + label.len();
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let rest = expr[from..].trim_start();
        let rest = ["=~", "!~", "!=", "="]
            .iter()
            .find_map(|op| rest.strip_prefix(op));
        let Some(rest) = rest.map(str::trim_start).and_then(|r| r.strip_prefix('"')) else {
            continue;
        };
        let value = &rest[..rest.find('"').expect("unterminated label value")];
        out.extend(value.split('|').map(str::to_string));
    }
    out
}

// ------------------------------------------------------------------------------------------
// Every file

#[test]
fn the_expected_artifacts_exist() {
    for rel in EXPECTED_FILES {
        assert!(deploy().join(rel).is_file(), "deploy/{rel} is missing");
    }
}

#[test]
fn every_yaml_and_json_file_parses() {
    let mut yaml_files = 0;
    let mut json_files = 0;
    for path in files_under(&deploy()) {
        let name = path.display().to_string();
        let text = fs::read_to_string(&path).unwrap();
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => {
                assert!(!yaml_docs(&text, &name).is_empty(), "{name}: no document");
                yaml_files += 1;
            }
            Some("json") => {
                serde_json::from_str::<serde_json::Value>(&text)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                json_files += 1;
            }
            _ => {}
        }
    }
    assert!(
        yaml_files >= 14 && json_files >= 1,
        "{yaml_files} YAML, {json_files} JSON"
    );
}

#[test]
fn the_shell_scripts_parse() {
    for script in [
        deploy().join("systemd/upgrade.sh"),
        repo().join("scripts/validate-deploy.sh"),
        repo().join("scripts/check-image.sh"),
    ] {
        let out = Command::new("bash")
            .arg("-n")
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ------------------------------------------------------------------------------------------
// Kubernetes

#[test]
fn the_configmap_config_is_accepted_by_the_config_loader() {
    let text = configmap_gateway_yaml();
    let cfg = Config::parse(&text, Path::new("deploy/k8s/gateway.yaml"), &TestEnv)
        .unwrap_or_else(|e| panic!("the ConfigMap's gateway.yaml is refused: {e}"));
    assert!(
        cfg.process.admin_listen.ip().is_unspecified(),
        "in a pod admin_listen must listen on all addresses (probes, Prometheus), not {}",
        cfg.process.admin_listen
    );
    assert!(!cfg.keys.is_empty() && !cfg.partners.is_empty());
    assert!(cfg.warnings.is_empty(), "warnings: {:?}", cfg.warnings);

    // Keys come only from the environment: nothing secret, not even a digest, in the ConfigMap.
    let raw: Value = serde_yaml::from_str(&text).unwrap();
    for list in ["keys", "partners"] {
        for entry in seq_at(&raw, list) {
            assert!(
                entry.get("key_env").is_some()
                    && entry.get("key").is_none()
                    && entry.get("sha256").is_none(),
                "{list}: every entry should use key_env: {entry:?}"
            );
        }
    }
}

#[test]
fn the_placeholder_secret_holds_only_placeholders_and_does_not_load() {
    let secret = k8s("Secret", "tollgate-keys");
    let data = at(&secret, "stringData").as_mapping().unwrap();
    assert!(
        secret.get("data").is_none(),
        "use stringData with placeholders only"
    );
    let mut env = BTreeMap::new();
    for (k, v) in data {
        assert_eq!(
            v.as_str(),
            Some("REPLACE_ME"),
            "{k:?} must be the placeholder REPLACE_ME"
        );
        env.insert(k.as_str().unwrap().to_string(), "REPLACE_ME".to_string());
    }
    // Applied as it is, the Secret must not yield a working gateway: identical keys are refused.
    let refused = Config::parse(
        &configmap_gateway_yaml(),
        Path::new("deploy/k8s/gateway.yaml"),
        &SecretEnv(env),
    );
    assert!(refused.is_err(), "the placeholder Secret must not load");

    let kustomization = yaml("k8s/kustomization.yaml");
    let resources: Vec<&str> = seq_at(&kustomization, "resources")
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert!(
        !resources.contains(&"secret.yaml"),
        "kustomization.yaml must not apply the placeholder Secret over real keys"
    );
}

#[test]
fn the_admin_token_is_wired_from_the_configmap_to_the_scrapers() {
    // The ConfigMap's config sets the token's digest: every admin path but /healthz and
    // /readyz (the probes') needs `Authorization: Bearer <token>`.
    let cfg = Config::parse(
        &configmap_gateway_yaml(),
        Path::new("deploy/k8s/gateway.yaml"),
        &TestEnv,
    )
    .unwrap();
    let digest = cfg
        .admin_token
        .expect("the ConfigMap's config must set admin_token_sha256");

    // The token itself: a placeholder Secret that the PodMonitor sends. Its placeholder must
    // not be the token the ConfigMap accepts.
    let secret = k8s("Secret", "tollgate-admin-token");
    assert!(secret.get("data").is_none(), "use stringData");
    let monitor = k8s("PodMonitor", "tollgate");
    let auth = at(&monitor, "spec.podMetricsEndpoints.0.authorization");
    assert_eq!(str_at(auth, "type"), "Bearer");
    assert_eq!(
        str_at(auth, "credentials.name"),
        str_at(&secret, "metadata.name")
    );
    let key = str_at(auth, "credentials.key");
    let placeholder = str_at(&secret, &format!("stringData.{key}"));
    assert_eq!(placeholder, "REPLACE_ME");
    assert_ne!(
        digest,
        tollgate::digest::Digest::of(placeholder.as_bytes()),
        "the ConfigMap must not accept the placeholder token"
    );

    // Both scrape configs send the token, read from a file on the Prometheus server.
    for file in [
        "prometheus/prometheus.yml",
        "prometheus/prometheus-kubernetes.yml",
    ] {
        for job in seq_at(&yaml(file), "scrape_configs") {
            let a = at(job, "authorization");
            assert_eq!(str_at(a, "type"), "Bearer", "{file}");
            assert!(
                str_at(a, "credentials_file").starts_with('/'),
                "{file}: an absolute credentials_file"
            );
        }
    }
}

#[test]
fn the_kustomization_lists_every_manifest_but_the_example_secret() {
    let kustomization = yaml("k8s/kustomization.yaml");
    let listed: BTreeSet<String> = seq_at(&kustomization, "resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = files_under(&deploy().join("k8s"))
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "kustomization.yaml" && n != "secret.yaml")
        .collect();
    assert_eq!(listed, present);
}

#[test]
fn the_deployment_wires_ports_probes_keys_and_shutdown() {
    let deployment = k8s("Deployment", "tollgate");
    let gateway: Value = serde_yaml::from_str(&configmap_gateway_yaml()).unwrap();
    let spec = at(&deployment, "spec.template.spec");
    let containers = seq_at(spec, "containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];

    assert!(u64_at(&deployment, "spec.replicas") >= 2);

    // Ports: named container ports match listen and admin_listen.
    let mut ports = BTreeMap::new();
    for p in seq_at(c, "ports") {
        ports.insert(str_at(p, "name").to_string(), u64_at(p, "containerPort"));
    }
    let admin_port = port_of(str_at(&gateway, "admin_listen"));
    assert_eq!(
        ports.get("http"),
        Some(&port_of(str_at(&gateway, "listen")))
    );
    assert_eq!(ports.get("admin"), Some(&admin_port));
    let resolve = |port: &Value| match port {
        Value::Number(n) => n.as_u64().unwrap(),
        Value::String(name) => *ports.get(name).unwrap_or_else(|| panic!("no port {name}")),
        other => panic!("bad probe port {other:?}"),
    };

    // Probes: liveness on /healthz, readiness on /readyz, both on the admin port.
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(str_at(c, &format!("{probe}.httpGet.path")), path);
        assert_eq!(
            resolve(at(c, &format!("{probe}.httpGet.port"))),
            admin_port,
            "{probe}"
        );
    }

    // The config file: the ConfigMap mounted where the args point.
    let args: Vec<&str> = seq_at(c, "args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["run", "--config", "/etc/tollgate/gateway.yaml"]);
    let mount = seq_at(c, "volumeMounts")
        .iter()
        .find(|m| str_at(m, "mountPath") == "/etc/tollgate")
        .expect("the config directory is mounted");
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees ConfigMap updates"
    );
    let volume = seq_at(spec, "volumes")
        .iter()
        .find(|v| str_at(v, "name") == str_at(mount, "name"))
        .unwrap();
    assert_eq!(str_at(volume, "configMap.name"), "tollgate-config");

    // state.path: its directory is a writable volume of the pod's own (the root is read-only),
    // which outlives a restart of the container.
    let state_cfg = Config::parse(
        &configmap_gateway_yaml(),
        Path::new("deploy/k8s/gateway.yaml"),
        &TestEnv,
    )
    .unwrap();
    let state_path = state_cfg
        .process
        .state_path
        .clone()
        .expect("the ConfigMap sets state.path");
    let state_dir = state_path.parent().unwrap().to_str().unwrap();
    let mount = seq_at(c, "volumeMounts")
        .iter()
        .find(|m| str_at(m, "mountPath") == state_dir)
        .expect("state.path's directory is mounted");
    assert!(mount.get("readOnly").is_none());
    let volume = seq_at(spec, "volumes")
        .iter()
        .find(|v| str_at(v, "name") == str_at(mount, "name"))
        .unwrap();
    assert!(volume.get("emptyDir").is_some(), "{volume:?}");

    // Shutdown: the kubelet must wait longer than drain + grace + timeout.
    let total = shutdown_total(&gateway);
    let grace = u64_at(spec, "terminationGracePeriodSeconds");
    assert!(
        grace > total,
        "terminationGracePeriodSeconds {grace} must exceed drain+grace+timeout = {total}"
    );

    // Keys: every key_env variable comes from the Secret, which defines it.
    let secret = k8s("Secret", "tollgate-keys");
    let mut env_from_secret = BTreeMap::new();
    for e in seq_at(c, "env") {
        if let Some(r) = e.get("valueFrom").and_then(|v| v.get("secretKeyRef")) {
            env_from_secret.insert(
                str_at(e, "name").to_string(),
                (str_at(r, "name").to_string(), str_at(r, "key").to_string()),
            );
        }
    }
    let mut wanted = BTreeSet::new();
    for list in ["keys", "partners"] {
        for entry in seq_at(&gateway, list) {
            wanted.insert(str_at(entry, "key_env").to_string());
        }
    }
    for var in &wanted {
        let (secret_name, key) = env_from_secret
            .get(var)
            .unwrap_or_else(|| panic!("{var} is not set from a secretKeyRef"));
        assert_eq!(secret_name, str_at(&secret, "metadata.name"), "{var}");
        assert!(
            at(&secret, "stringData").get(key.as_str()).is_some(),
            "the Secret lacks {key}"
        );
    }
    assert_eq!(
        env_from_secret.keys().cloned().collect::<BTreeSet<_>>(),
        wanted,
        "Secret-backed variables that no key_env uses"
    );

    // Security context.
    assert_eq!(
        at(spec, "securityContext.runAsNonRoot").as_bool(),
        Some(true)
    );
    let sc = at(c, "securityContext");
    assert_eq!(at(sc, "runAsNonRoot").as_bool(), Some(true));
    assert_eq!(at(sc, "readOnlyRootFilesystem").as_bool(), Some(true));
    assert_eq!(at(sc, "allowPrivilegeEscalation").as_bool(), Some(false));
    assert!(seq_at(sc, "capabilities.drop")
        .iter()
        .any(|d| d.as_str() == Some("ALL")));

    // Resources.
    for r in ["requests.cpu", "requests.memory", "limits.memory"] {
        at(c, &format!("resources.{r}"));
    }

    // Annotations: scraping on the admin port, and the checksum of the ConfigMap file.
    let annotations = at(&deployment, "spec.template.metadata.annotations");
    assert_eq!(key(annotations, "prometheus.io/scrape"), "true");
    assert_eq!(
        key(annotations, "prometheus.io/port"),
        admin_port.to_string()
    );
    assert_eq!(key(annotations, "prometheus.io/path"), "/metrics");
    let sha = tollgate::digest::Digest::of(read("k8s/configmap.yaml").as_bytes()).to_hex();
    assert_eq!(
        key(annotations, "checksum/config"),
        sha,
        "deploy/k8s/deployment.yaml: set checksum/config to the sha256 of configmap.yaml \
         (`sha256sum deploy/k8s/configmap.yaml`) so that the change rolls the pods"
    );
}

#[test]
fn the_admin_port_stays_off_the_public_service() {
    let public = k8s("Service", "tollgate");
    let ports = seq_at(&public, "spec.ports");
    assert!(ports
        .iter()
        .any(|p| u64_at(p, "port") == 80 && at(p, "targetPort").as_str() == Some("http")));
    for p in ports {
        let target = at(p, "targetPort");
        assert!(
            target.as_str() != Some("admin") && target.as_u64() != Some(9091),
            "the public Service exposes the admin port"
        );
    }
    let admin = k8s("Service", "tollgate-admin");
    assert_eq!(str_at(&admin, "spec.type"), "ClusterIP");
    assert_eq!(str_at(&admin, "spec.clusterIP"), "None");

    let monitor = k8s("PodMonitor", "tollgate");
    let endpoints = seq_at(&monitor, "spec.podMetricsEndpoints");
    assert!(endpoints
        .iter()
        .all(|e| str_at(e, "port") == "admin" && str_at(e, "path") == "/metrics"));
    let labels = at(
        &k8s("Deployment", "tollgate"),
        "spec.template.metadata.labels",
    )
    .clone();
    for (k, v) in at(&monitor, "spec.selector.matchLabels")
        .as_mapping()
        .unwrap()
    {
        assert_eq!(
            labels.get(k.as_str().unwrap()),
            Some(v),
            "PodMonitor selector {k:?}"
        );
    }
}

/// Bytes of a Kubernetes memory quantity: `256Mi`, `1Gi`, `300M`, `1000`.
fn k8s_bytes(q: &str) -> u64 {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let n: u64 = n
        .parse()
        .unwrap_or_else(|_| panic!("`{q}` is not a quantity"));
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => panic!("`{q}`: unit {other} not handled here"),
    }
}

/// Bytes of a Redis/Valkey size (case-insensitive): `128mb`, `1gb`, `1m`, `100000`.
fn redis_bytes(q: &str) -> u64 {
    let q = q.to_ascii_lowercase();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("`{q}` is not a size"));
    n * match unit {
        "" | "b" => 1,
        "k" => 1_000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        other => panic!("`{q}`: unit {other} is not a Redis size unit"),
    }
}

#[test]
fn the_shared_budget_store_is_private_ephemeral_and_bounded() {
    // The ConfigMap's `cluster:` block names the Service of redis.yaml, without a password.
    let cfg = Config::parse(
        &configmap_gateway_yaml(),
        Path::new("deploy/k8s/gateway.yaml"),
        &TestEnv,
    )
    .unwrap();
    let cluster = cfg
        .process
        .cluster
        .as_ref()
        .expect("the ConfigMap's gateway.yaml has a `cluster:` block");
    let rest = cluster
        .redis_url
        .strip_prefix("redis://")
        .expect("the in-cluster store is reached with redis://");
    let authority = rest.split('/').next().unwrap();
    assert!(
        !authority.contains('@'),
        "no password in the ConfigMap: use redis_url_env and a Secret"
    );
    let (host, port) = authority.split_once(':').unwrap_or((authority, "6379"));
    let port: u64 = port.parse().unwrap();

    let service = k8s("Service", host);
    assert_eq!(str_at(&service, "spec.type"), "ClusterIP");
    let service_port = seq_at(&service, "spec.ports")
        .iter()
        .find(|p| u64_at(p, "port") == port)
        .unwrap_or_else(|| panic!("Service {host} has no port {port}"));

    // One store, never two side by side (replicas on different stores share nothing).
    let deployment = k8s("Deployment", host);
    assert_eq!(u64_at(&deployment, "spec.replicas"), 1);
    assert_eq!(str_at(&deployment, "spec.strategy.type"), "Recreate");
    let pod_labels = at(&deployment, "spec.template.metadata.labels").clone();
    let selects = |selector: &Value| {
        selector
            .as_mapping()
            .unwrap()
            .iter()
            .all(|(k, v)| pod_labels.get(k.as_str().unwrap()) == Some(v))
    };
    assert!(selects(at(&service, "spec.selector")));
    assert!(selects(at(&deployment, "spec.selector.matchLabels")));
    // ... and nothing of the gateway's selects it.
    for (kind, name, path) in [
        ("Service", "tollgate", "spec.selector"),
        ("Service", "tollgate-admin", "spec.selector"),
        ("PodMonitor", "tollgate", "spec.selector.matchLabels"),
        ("NetworkPolicy", "tollgate", "spec.podSelector.matchLabels"),
        ("Deployment", "tollgate", "spec.selector.matchLabels"),
    ] {
        assert!(
            !selects(at(&k8s(kind, name), path)),
            "{kind} {name} selects the store's pods"
        );
    }

    let spec = at(&deployment, "spec.template.spec");
    let containers = seq_at(spec, "containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];

    // A pinned image: a version tag (a digest may follow), never latest.
    let image = str_at(c, "image");
    let tag = image
        .split('@')
        .next()
        .unwrap()
        .rsplit_once(':')
        .map_or("", |(_, t)| t);
    assert!(
        tag.starts_with(|ch: char| ch.is_ascii_digit()) && tag.matches('.').count() >= 2,
        "pin a patch release: {image}"
    );

    // The Service reaches the server's port (args set none: the default, 6379).
    let args: Vec<&str> = seq_at(c, "args")
        .iter()
        .map(|a| a.as_str().expect("args are strings"))
        .collect();
    let arg = |name: &str| {
        args.iter().position(|a| *a == name).map(|i| {
            *args
                .get(i + 1)
                .unwrap_or_else(|| panic!("{name} has no value"))
        })
    };
    assert_eq!(arg("--port"), None);
    let target = at(service_port, "targetPort");
    let container_port = seq_at(c, "ports")
        .iter()
        .find(|p| {
            target.as_str() == Some(str_at(p, "name"))
                || target.as_u64() == Some(u64_at(p, "containerPort"))
        })
        .expect("the Service's targetPort is a port of the container");
    assert_eq!(u64_at(container_port, "containerPort"), 6379);

    // No persistence; a memory cap with eviction (every entry expires, so evicting loses at most
    // a window's accuracy), inside the container's limit with room for fragmentation.
    assert_eq!(arg("--save"), Some(""), "no RDB snapshots");
    assert_eq!(arg("--appendonly"), Some("no"), "no append-only file");
    let policy = arg("--maxmemory-policy").expect("--maxmemory-policy");
    assert!(
        matches!(
            policy,
            "allkeys-lru" | "allkeys-lfu" | "volatile-ttl" | "volatile-lru" | "volatile-lfu"
        ),
        "--maxmemory-policy {policy}: the store must evict, not refuse writes"
    );
    let maxmemory = redis_bytes(arg("--maxmemory").expect("--maxmemory"));
    assert!(maxmemory > 0);
    for r in [
        "requests.cpu",
        "requests.memory",
        "limits.cpu",
        "limits.memory",
    ] {
        at(c, &format!("resources.{r}"));
    }
    let limit = k8s_bytes(str_at(c, "resources.limits.memory"));
    assert!(
        limit >= maxmemory / 2 * 3,
        "memory limit {limit} B leaves too little above maxmemory {maxmemory} B"
    );

    // Probes that ask the server itself.
    for probe in ["readinessProbe", "livenessProbe"] {
        let p = at(c, probe);
        let asks = p.get("tcpSocket").is_some()
            || p.get("exec").is_some_and(|e| {
                let mut words = Vec::new();
                yaml_strings(e, &mut words);
                words.iter().any(|w| w.contains("ping"))
            });
        assert!(asks, "{probe}: tcpSocket, or exec with `ping`");
    }

    // Unprivileged, read-only root, writable /data on an emptyDir.
    assert_eq!(
        at(spec, "securityContext.runAsNonRoot").as_bool(),
        Some(true)
    );
    let sc = at(c, "securityContext");
    assert_eq!(at(sc, "runAsNonRoot").as_bool(), Some(true));
    assert_eq!(at(sc, "readOnlyRootFilesystem").as_bool(), Some(true));
    assert_eq!(at(sc, "allowPrivilegeEscalation").as_bool(), Some(false));
    assert!(seq_at(sc, "capabilities.drop")
        .iter()
        .any(|d| d.as_str() == Some("ALL")));
    let mount = seq_at(c, "volumeMounts")
        .iter()
        .find(|m| str_at(m, "mountPath") == "/data")
        .expect("/data is mounted");
    assert_ne!(mount.get("readOnly").and_then(Value::as_bool), Some(true));
    let volume = seq_at(spec, "volumes")
        .iter()
        .find(|v| str_at(v, "name") == str_at(mount, "name"))
        .unwrap();
    assert!(volume.get("emptyDir").is_some(), "/data is an emptyDir");

    // Only the gateway pods may connect, and only to the store's port.
    let gateway_labels = at(
        &k8s("Deployment", "tollgate"),
        "spec.template.metadata.labels",
    )
    .clone();
    let netpol = k8s("NetworkPolicy", host);
    assert!(selects(at(&netpol, "spec.podSelector.matchLabels")));
    assert!(seq_at(&netpol, "spec.policyTypes")
        .iter()
        .any(|t| t.as_str() == Some("Ingress")));
    let rules = seq_at(&netpol, "spec.ingress");
    assert!(!rules.is_empty());
    for rule in rules {
        let from = seq_at(rule, "from");
        assert!(
            !from.is_empty(),
            "an ingress rule without `from` admits anyone"
        );
        for peer in from {
            assert!(
                peer.get("namespaceSelector").is_none() && peer.get("ipBlock").is_none(),
                "only pods of the namespace: {peer:?}"
            );
            let wanted = at(peer, "podSelector.matchLabels").as_mapping().unwrap();
            assert!(
                !wanted.is_empty()
                    && wanted
                        .iter()
                        .all(|(k, v)| gateway_labels.get(k.as_str().unwrap()) == Some(v)),
                "{wanted:?} is not the gateway pods"
            );
        }
        for p in seq_at(rule, "ports") {
            let port = at(p, "port");
            assert!(
                port.as_str() == Some(str_at(container_port, "name"))
                    || port.as_u64() == Some(6379),
                "ingress port {port:?}"
            );
        }
    }

    // If the gateway's policy restricts egress, it lets the gateway reach the store.
    let gateway_policy = k8s("NetworkPolicy", "tollgate");
    if seq_at(&gateway_policy, "spec.policyTypes")
        .iter()
        .any(|t| t.as_str() == Some("Egress"))
    {
        let reaches = gateway_policy["spec"]
            .get("egress")
            .and_then(Value::as_sequence)
            .is_some_and(|rules| {
                rules.iter().any(|r| {
                    r.get("ports")
                        .and_then(Value::as_sequence)
                        .is_none_or(|ps| ps.iter().any(|p| p["port"].as_u64() == Some(port)))
                })
            });
        assert!(
            reaches,
            "the gateway's egress rules do not allow port {port}"
        );
    }
}

// ------------------------------------------------------------------------------------------
// systemd

#[test]
fn the_systemd_unit_is_hardened() {
    let unit = parse_unit(&read("systemd/tollgate.service"));
    let s = "Service";
    for (key, want) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("RestrictNamespaces", "yes"),
        ("RuntimeDirectory", "tollgate"),
        ("ConfigurationDirectory", "tollgate"),
        ("KillSignal", "SIGTERM"),
        ("Restart", "on-failure"),
        ("Type", "forking"),
    ] {
        assert_eq!(unit_value(&unit, s, key), want, "{key}=");
    }
    assert!(unit_values(&unit, s, "SystemCallFilter").contains(&"@system-service".to_string()));
    assert!(unit_value(&unit, s, "LimitNOFILE").parse::<u64>().unwrap() >= 65536);

    // Its own unprivileged user, and no capabilities (the default ports are above 1024).
    let dynamic = unit_values(&unit, s, "DynamicUser")
        .last()
        .map(String::as_str)
        == Some("yes");
    let user = unit_values(&unit, s, "User").last().cloned();
    assert!(dynamic || user.as_deref().is_some_and(|u| u != "root"));
    assert_eq!(unit_value(&unit, s, "CapabilityBoundingSet"), "");
    assert_eq!(
        unit_values(&unit, s, "AmbientCapabilities")
            .last()
            .map_or("", String::as_str),
        ""
    );

    // Commands: a config check before start and on reload; run daemonized with the Pingora
    // conf (Pingora's systemd integration); reload = SIGHUP.
    let config = format!("--config {UNIT_CONFIG}");
    assert_eq!(
        unit_value(&unit, s, "ExecStartPre"),
        format!("{UNIT_BIN} check {config}")
    );
    let start = unit_value(&unit, s, "ExecStart");
    assert!(start.starts_with(&format!("{UNIT_BIN} run ")), "{start}");
    for part in [
        config.as_str(),
        &format!("--conf {UNIT_PINGORA_CONF}"),
        "--daemon",
    ] {
        assert!(start.contains(part), "ExecStart lacks `{part}`: {start}");
    }
    let reload = unit_values(&unit, s, "ExecReload");
    assert!(reload
        .iter()
        .any(|r| r.contains("-HUP $MAINPID") || r.contains("/reload")));

    // Stop timeout above drain + grace + timeout of the config operators start from.
    let stop = unit_value(&unit, s, "TimeoutStopSec");
    let stop: u64 = stop
        .strip_suffix('s')
        .unwrap_or(stop)
        .parse()
        .unwrap_or_else(|_| panic!("TimeoutStopSec={stop}: write it in seconds"));
    let policies = fs::read_to_string(repo().join("policies/gateway.yaml")).unwrap();
    let total = shutdown_total(&serde_yaml::from_str::<Value>(&policies).unwrap());
    assert!(
        stop > total,
        "TimeoutStopSec={stop} must exceed drain+grace+timeout = {total}"
    );

    // The PID file and the upgrade socket sit in the RuntimeDirectory, where Pingora puts them.
    let pingora = yaml("systemd/pingora.yaml");
    assert_eq!(
        unit_value(&unit, s, "PIDFile"),
        str_at(&pingora, "pid_file")
    );
    for key in ["pid_file", "upgrade_sock"] {
        assert!(str_at(&pingora, key).starts_with("/run/tollgate/"), "{key}");
    }
}

#[test]
fn the_pingora_conf_is_valid_and_uses_only_known_keys() {
    use pingora::server::configuration::ServerConf;
    let text = read("systemd/pingora.yaml");
    let conf = ServerConf::from_yaml(&text).expect("Pingora accepts pingora.yaml");
    assert!(
        !conf.daemon,
        "--daemon belongs on the command line (ExecStart)"
    );
    assert!(
        !conf.daemon_wait_for_ready,
        "tollgate never signals readiness to a waiting parent"
    );
    // Pingora ignores unknown keys; a typo would silently do nothing.
    let known = serde_yaml::to_value(ServerConf::default()).unwrap();
    for key in yaml("systemd/pingora.yaml").as_mapping().unwrap().keys() {
        let key = key.as_str().unwrap();
        assert!(
            known.get(key).is_some(),
            "pingora.yaml: `{key}` is not a Pingora setting"
        );
        assert!(
            !matches!(
                key,
                "grace_period_seconds" | "graceful_shutdown_timeout_seconds"
            ),
            "pingora.yaml: `{key}` is overridden by gateway.yaml's shutdown block"
        );
    }
}

#[test]
fn the_upgrade_script_follows_pingoras_sequence_with_the_units_paths() {
    let script = read("systemd/upgrade.sh");
    for part in [
        "/bin/kill -QUIT $MAINPID",
        "--upgrade --daemon",
        &format!("TOLLGATE_BIN:-{UNIT_BIN}"),
        &format!("TOLLGATE_CONFIG:-{UNIT_CONFIG}"),
        &format!("TOLLGATE_PINGORA_CONF:-{UNIT_PINGORA_CONF}"),
    ] {
        assert!(script.contains(part), "upgrade.sh lacks `{part}`");
    }
}

// ------------------------------------------------------------------------------------------
// Docker

#[test]
fn the_dockerfile_builds_locked_and_runs_unprivileged() {
    let dockerfile = read("docker/Dockerfile");
    for line in [
        "FROM rust:1.95-bookworm AS build",
        "FROM gcr.io/distroless/cc-debian12:nonroot",
        "USER nonroot",
        "EXPOSE 8080 9091",
        "ENTRYPOINT [\"/usr/local/bin/tollgate\"]",
        "CMD [\"run\", \"--config\", \"/etc/tollgate/gateway.yaml\"]",
    ] {
        assert!(
            dockerfile.lines().any(|l| l.trim() == line),
            "Dockerfile lacks `{line}`"
        );
    }
    assert!(dockerfile.contains("cargo build --release --locked"));

    // What the build stage copies exists, and the ignore file does not drop it.
    let ignored: Vec<String> = read("docker/Dockerfile.dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    for line in dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        for src in &words[1..words.len() - 1] {
            assert!(
                repo().join(src).exists(),
                "COPY source {src} does not exist"
            );
            assert!(
                !ignored.iter().any(|i| i == src),
                "{src} is in Dockerfile.dockerignore"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// Prometheus and Grafana

#[test]
fn alerts_and_dashboard_name_only_exported_metrics_and_label_values() {
    let known: BTreeSet<String> = METRICS.iter().map(|m| m.to_string()).collect();
    for path in files_under(&deploy()) {
        let text = fs::read_to_string(&path).unwrap();
        for name in metric_names(&text) {
            assert!(
                known.contains(&name),
                "{}: unknown metric {name}",
                path.display()
            );
        }
    }

    let mut exprs = Vec::new();
    yaml_strings(&yaml("prometheus/alerts.yml"), &mut exprs);
    for doc in yaml_docs(&read("prometheus/alerts.test.yml"), "alerts.test.yml") {
        yaml_strings(&doc, &mut exprs);
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("grafana/tollgate.json")).unwrap();
    json_strings(&dashboard, &mut exprs);
    for expr in &exprs {
        for (label, allowed) in LABEL_VALUES {
            for value in label_values(expr, label) {
                assert!(
                    allowed.contains(&value.as_str()),
                    "{label}=\"{value}\" in: {expr}"
                );
            }
        }
    }

    // The dashboard shows every metric.
    let used = metric_names(&read("grafana/tollgate.json"));
    assert_eq!(used, known, "metrics the dashboard does not show");
}

#[test]
fn every_alert_has_for_severity_summary_description_and_a_test() {
    let alerts = yaml("prometheus/alerts.yml");
    let tests = read("prometheus/alerts.test.yml");
    let mut names = BTreeSet::new();
    for group in seq_at(&alerts, "groups") {
        for rule in seq_at(group, "rules") {
            let name = str_at(rule, "alert");
            assert!(names.insert(name.to_string()), "{name} is defined twice");
            assert!(rule.get("for").is_some(), "{name}: no `for:`");
            let severity = str_at(rule, "labels.severity");
            assert!(
                matches!(severity, "critical" | "warning" | "info"),
                "{name}: {severity}"
            );
            for a in ["annotations.summary", "annotations.description"] {
                assert!(!str_at(rule, a).trim().is_empty(), "{name}: empty {a}");
            }
            assert!(
                str_at(rule, "expr").contains("job=\"tollgate\""),
                "{name}: not job=\"tollgate\""
            );
            assert!(
                tests.contains(&format!("alertname: {name}\n")),
                "{name}: no test in alerts.test.yml"
            );
        }
    }
    for wanted in [
        "TollgateHigh5xxRatio",
        "TollgateUpstreamErrors",
        "TollgateRateLimitSpike",
        "TollgateConfigReloadFailed",
        "TollgateMetricsAbsent",
        "TollgateHighLatencyP99",
        "TollgateClusterStoreDown",
        "TollgateClusterReplicasDisagree",
        "TollgateClusterSyncSlow",
    ] {
        assert!(names.contains(wanted), "alerts.yml lacks {wanted}");
    }
}

#[test]
fn every_scrape_config_ends_in_job_tollgate_and_loads_the_alerts() {
    let plain = yaml("prometheus/prometheus.yml");
    let jobs = seq_at(&plain, "scrape_configs");
    assert!(jobs.iter().any(|j| str_at(j, "job_name") == "tollgate"));

    let k8s_prom = yaml("prometheus/prometheus-kubernetes.yml");
    for job in seq_at(&k8s_prom, "scrape_configs") {
        let relabels = seq_at(job, "relabel_configs");
        assert!(
            relabels
                .iter()
                .any(|r| r.get("target_label") == Some(&Value::from("job"))
                    && r.get("replacement") == Some(&Value::from("tollgate"))),
            "{}: targets must end up with job=\"tollgate\"",
            str_at(job, "job_name")
        );
    }
    for config in [&plain, &k8s_prom] {
        for f in seq_at(config, "rule_files") {
            assert!(deploy()
                .join("prometheus")
                .join(f.as_str().unwrap())
                .is_file());
        }
    }
    let monitor = k8s("PodMonitor", "tollgate");
    let relabels = seq_at(&monitor, "spec.podMetricsEndpoints.0.relabelings");
    assert!(relabels
        .iter()
        .any(|r| str_at(r, "targetLabel") == "job" && str_at(r, "replacement") == "tollgate"));
}

#[test]
fn the_dashboard_uses_a_datasource_variable_and_quantiles_over_rates() {
    let d: serde_json::Value = serde_json::from_str(&read("grafana/tollgate.json")).unwrap();
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    let vars = d["templating"]["list"].as_array().unwrap();
    assert!(vars.iter().any(|v| v["type"] == "datasource"
        && v["name"] == "datasource"
        && v["query"] == "prometheus"));

    let mut ids = BTreeSet::new();
    let mut quantile_panels = 0;
    for p in d["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate panel id {}",
            p["id"]
        );
        let grid = &p["gridPos"];
        assert!(grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24);
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {}",
            p["title"]
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        let mut quantiles = 0;
        for t in targets {
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "panel {}",
                p["title"]
            );
            let expr = t["expr"].as_str().unwrap();
            if expr.contains("histogram_quantile") {
                assert!(
                    expr.contains("_bucket{") && expr.contains("rate("),
                    "{expr}"
                );
                assert!(expr.contains("le"), "{expr}: quantiles need `le` kept");
                quantiles += 1;
            }
        }
        if quantiles > 0 {
            assert_eq!(quantiles, 3, "p50, p95 and p99 in {}", p["title"]);
            quantile_panels += 1;
        }
    }
    assert_eq!(
        quantile_panels, 4,
        "request latency, upstream latency, cluster sync duration and waits for the store"
    );
}

#[test]
fn the_scanners_find_what_they_should() {
    let names = metric_names(
        "rate(tollgate_request_duration_seconds_bucket[5m]) x_tollgate_no tollgate_keys tollgate_",
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["tollgate_keys", "tollgate_request_duration_seconds"]
    );
    assert_eq!(
        label_values(
            r#"x{outcome=~"a|b", class="5xx", sub_outcome="z"}"#,
            "outcome"
        ),
        ["a", "b"]
    );
    let unit = parse_unit("[A]\n# c\nK=1\nK=2\nL=x \\\n  y\n");
    assert_eq!(unit_values(&unit, "A", "K"), ["1", "2"]);
    assert_eq!(unit_value(&unit, "A", "L"), "x  y");
}

#[test]
fn the_metric_list_here_is_every_metric_the_gateway_registers() {
    // The names registered in the source (each is a string literal "tollgate_…" there), so that
    // a new metric cannot be left out of the dashboard and the checks above.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut registered = BTreeSet::new();
    for path in files_under(&src) {
        let text = fs::read_to_string(&path).unwrap();
        for (i, _) in text.match_indices("\"tollgate_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if text[i + 1 + name.len()..].starts_with('"') {
                registered.insert(name);
            }
        }
    }
    let listed: BTreeSet<String> = METRICS.iter().map(|m| m.to_string()).collect();
    assert_eq!(registered, listed);
}

// ------------------------------------------------------------------------------------------
// Traces: gateway -> collector -> Tempo -> Grafana

/// The port of a collector or Tempo `endpoint` (`0.0.0.0:4318`, `tempo:4317`).
fn endpoint_port(v: &str) -> u64 {
    v.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn the_trace_pipeline_is_wired_from_the_gateway_to_tempo_and_grafana() {
    // Kubernetes: the ConfigMap's tracing block names the collector's Service and port, the
    // Service reaches the container port the collector's OTLP/HTTP receiver listens on, and
    // only the gateway pods may post to it.
    let gateway_yaml: Value = serde_yaml::from_str(&configmap_gateway_yaml()).unwrap();
    let endpoint = str_at(&gateway_yaml, "tracing.otlp_endpoint");
    let service = k8s("Service", "tollgate-otel-collector");
    let port = &seq_at(&service, "spec.ports")[0];
    assert_eq!(
        endpoint,
        format!(
            "http://{}:{}",
            str_at(&service, "metadata.name"),
            u64_at(port, "port")
        )
    );
    let deployment = k8s("Deployment", "tollgate-otel-collector");
    let container = &seq_at(&deployment, "spec.template.spec.containers")[0];
    let cport = &seq_at(container, "ports")[0];
    assert_eq!(str_at(port, "targetPort"), str_at(cport, "name"));
    let config_map = k8s("ConfigMap", "tollgate-otel-collector");
    let collector: Value =
        serde_yaml::from_str(key(at(&config_map, "data"), "collector.yaml")).unwrap();
    let receiver = str_at(&collector, "receivers.otlp.protocols.http.endpoint");
    assert_eq!(endpoint_port(receiver), u64_at(cport, "containerPort"));
    let policy = k8s("NetworkPolicy", "tollgate-otel-collector");
    let from = &seq_at(&seq_at(&policy, "spec.ingress")[0], "from")[0];
    let gateway = k8s("Deployment", "tollgate");
    let gateway_labels = at(&gateway, "spec.template.metadata.labels");
    for (k, v) in at(from, "podSelector.matchLabels").as_mapping().unwrap() {
        assert_eq!(gateway_labels.get(k), Some(v), "{k:?}");
    }
    // The config loads with its tracing block, and the pipeline exports what it receives.
    let cfg = Config::parse(
        &configmap_gateway_yaml(),
        Path::new("deploy/k8s/gateway.yaml"),
        &TestEnv,
    )
    .unwrap();
    assert!(cfg.process.tracing.is_some());
    let pipeline = at(&collector, "service.pipelines.traces");
    assert_eq!(seq_at(pipeline, "receivers")[0].as_str(), Some("otlp"));
    assert_eq!(seq_at(pipeline, "exporters")[0].as_str(), Some("otlp"));

    // One host: the collector's exporter reaches Tempo's OTLP/gRPC receiver, Grafana reaches
    // Tempo's query port, and compose mounts each file where its program reads it.
    let collector = yaml("otel/collector.yaml");
    let tempo = yaml("otel/tempo.yaml");
    let grafana = yaml("otel/grafana-datasources.yaml");
    let compose = yaml("otel/compose.yaml");
    let exporter = str_at(&collector, "exporters.otlp.endpoint");
    assert_eq!(exporter.split(':').next(), Some("tempo"));
    assert!(at(&compose, "services").get("tempo").is_some());
    assert_eq!(
        endpoint_port(exporter),
        endpoint_port(str_at(
            &tempo,
            "distributor.receivers.otlp.protocols.grpc.endpoint"
        ))
    );
    let tempo_source = seq_at(&grafana, "datasources")
        .iter()
        .find(|d| str_at(d, "type") == "tempo")
        .expect("a Tempo data source");
    assert_eq!(
        str_at(tempo_source, "url"),
        format!("http://tempo:{}", u64_at(&tempo, "server.http_listen_port"))
    );
    assert_eq!(
        endpoint_port(str_at(&collector, "receivers.otlp.protocols.http.endpoint")),
        4318,
        "the port tracing.otlp_endpoint defaults to"
    );
    let mounts = |svc: &str| -> Vec<String> {
        seq_at(&compose, &format!("services.{svc}.volumes"))
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    for (svc, file) in [
        ("otel-collector", "./collector.yaml"),
        ("tempo", "./tempo.yaml"),
        ("grafana", "./grafana-datasources.yaml"),
    ] {
        assert!(
            mounts(svc)
                .iter()
                .any(|m| m.starts_with(&format!("{file}:"))),
            "{svc} mounts {file}"
        );
    }
}
