//! `GET /api/openapi.json` on the wire: the admin API's OpenAPI 3.1 document. The test also
//! writes it to `$CARGO_TARGET_TMPDIR/openapi.json`, where `scripts/test.sh` has a real
//! validator (`openapi-spec-validator`) read it after the tests.

use std::fs;
use std::path::Path;

use crate::harness::{Gateway, Mode, Upstream};

#[test]
fn the_admin_listener_serves_its_openapi_document() {
    let gw = Gateway::with(&Upstream::start(Mode::Ok));
    let r = gw.admin("GET", "/api/openapi.json");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let doc = r.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"), "{doc}");
    assert_eq!(doc["info"]["title"], "Tollgate admin API");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    let paths = doc["paths"].as_object().unwrap();
    for (method, path) in [
        ("get", "/"),
        ("post", "/reload"),
        ("get", "/api/usage"),
        ("delete", "/api/blocks/{address}"),
        ("get", "/api/ledger"),
        ("get", "/api/keys"),
        ("post", "/api/keys/revoke"),
        ("put", "/api/keys/{name}/quota"),
        ("get", "/api/openapi.json"),
    ] {
        assert!(paths[path].get(method).is_some(), "{method} {path}");
    }
    // Served the same to every request (made once).
    assert_eq!(gw.admin("GET", "/api/openapi.json").body, r.body);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("openapi.json");
    fs::write(&out, &r.body).unwrap();
}
