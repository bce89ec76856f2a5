//! Golden test: every config shipped in `policies/` loads, and every broken one in
//! `policies/invalid/` is refused with exactly the message in its paired `.expected` file
//! (the gateway's `tollgate check` test reads the same files through the binary).
//!
//! Paths are relative to the workspace root, as the `.expected` files spell them.

use std::path::{Path, PathBuf};
use std::sync::Once;

use tollgate_core::config::routes::Catalogue;
use tollgate_core::config::Config;

/// The workspace root as the working directory: the shipped files name themselves from there.
fn at_root() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).unwrap();
    });
}

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    at_root();
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| Path::new(dir).join(p.file_name().unwrap()))
        .collect();
    v.sort();
    v
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
            Vec::<&tollgate_core::config::Warning>::new(),
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
fn the_catalogue_has_the_contract_routes_with_their_spec_paths() {
    use tollgate_core::config::routes::{Family, MethodSel, PathMatch};
    at_root();
    let c = Catalogue::builtin();
    let shipped: tollgate_core::config::file::FileCatalogue =
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
    at_root();
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
    let tollgate_core::config::Allow::Only(ids) = &basic.allow else {
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
