//! The route table held to `ROUTES`, both ways.

use super::*;

const METHODS: [Method; 7] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::PATCH,
    Method::OPTIONS,
];

/// A path of `pattern`, its `{…}` filled in.
fn sample(pattern: &str) -> String {
    pattern
        .replace("{name}", "shop%2F42")
        .replace("{address}", "192.0.2.7")
}

/// The row `method` takes on a path of `pattern`, if any.
fn row_of(method: &Method, pattern: &str) -> Option<(&'static str, &'static str)> {
    let m = if method == Method::HEAD {
        "GET"
    } else {
        method.as_str()
    };
    ROUTES
        .iter()
        .copied()
        .find(|&(rm, rp)| rm == m && rp == pattern)
}

/// Whether `path` is a path of `pattern` (a `{…}` segment stands for any).
fn instance(pattern: &str, path: &str) -> bool {
    let (p, q): (Vec<_>, Vec<_>) = (pattern.split('/').collect(), path.split('/').collect());
    p.len() == q.len() && p.iter().zip(&q).all(|(p, q)| p.starts_with('{') || p == q)
}

#[test]
fn the_match_answers_every_row_of_routes_and_nothing_else() {
    for &(_, pattern) in ROUTES {
        let path = sample(pattern);
        for method in &METHODS {
            match (classify(method, &path), row_of(method, pattern)) {
                (Ok(route), Some(row)) => assert_eq!(route.row(), row, "{method} {path}"),
                // `GET /api/keys/revoke`: the key named `revoke`, another row's path.
                (Ok(route), None) => {
                    let (m, p) = route.row();
                    assert!(row_of(method, p) == Some((m, p)) && instance(p, &path));
                }
                (Err(Miss::NotAllowed(allow)), None) => {
                    // Every method `Allow` names is answered on this path.
                    for m in allow.split(", ") {
                        let m = Method::from_bytes(m.as_bytes()).unwrap();
                        assert!(classify(&m, &path).is_ok(), "{m} {path} ({allow})");
                    }
                }
                (got, want) => panic!("{method} {path}: {got:?}, ROUTES has {want:?}"),
            }
        }
    }
    // Every route names its own row, and the rows are distinct.
    let mut rows = ROUTES.to_vec();
    rows.sort_unstable();
    rows.dedup();
    assert_eq!(rows.len(), ROUTES.len());
}

#[test]
fn names_are_decoded_and_other_paths_are_404() {
    let get = &Method::GET;
    assert_eq!(
        classify(get, "/api/keys/shop%2F42"),
        Ok(Route::ShowKey("shop/42".into()))
    );
    assert_eq!(
        classify(&Method::POST, "/api/keys/%72evoke"),
        Ok(Route::RevokeSecret)
    );
    assert_eq!(
        classify(&Method::DELETE, "/api/overrides/a/b%20c"),
        Ok(Route::DeleteOverride("a/b c".into()))
    );
    assert_eq!(
        classify(&Method::PUT, "/api/keys/k/limit"),
        Ok(Route::Key("k".into(), KeyOp::SetLimit))
    );
    assert_eq!(
        classify(get, "/api/keys/"),
        Ok(Route::ShowKey(String::new()))
    );
    assert_eq!(classify(get, "/api/keys"), Ok(Route::ListKeys));
    for path in ["/nothing", "/metrics/", "/api/usage/", "/api", "*", ""] {
        assert_eq!(classify(get, path), Err(Miss::NotFound), "{path}");
    }
    for path in [
        "/api/keys/k/",
        "/api/keys/k/suspend/x",
        "/api/keys/k/promote",
    ] {
        assert_eq!(classify(get, path), Err(Miss::NoKeyOperation), "{path}");
    }
    assert_eq!(
        classify(&Method::PUT, "/api/keys/revoke"),
        Err(Miss::NotAllowed("GET, HEAD, DELETE"))
    );
    assert_eq!(
        classify(get, "/api/blocks/192.0.2.7"),
        Err(Miss::NotAllowed("DELETE"))
    );
}

#[test]
fn the_routes_that_read_a_body_are_those_the_document_gives_one() {
    // Held to the OpenAPI table: each change without a body there refuses one here.
    let bodies = ["/api/keys", "/api/keys/{name}/rotate", "/api/keys/revoke"];
    let changes = [
        "/api/keys/{name}/suspend",
        "/api/keys/{name}/limit",
        "/api/keys/{name}/quota",
    ];
    for &(method, pattern) in ROUTES {
        let takes = crate::admin::openapi::takes_body(method, pattern);
        let reads = method == "GET"
            || (matches!(method, "POST" | "PUT") && bodies.contains(&pattern))
            || (matches!(method, "POST" | "PUT") && changes.contains(&pattern));
        assert_eq!(takes, reads, "{method} {pattern}");
    }
}
