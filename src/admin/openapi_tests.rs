//! The document held to `ROUTES` and the code table.

use std::collections::BTreeSet;

use serde_json::Value;

use super::*;
use crate::admin::router::ROUTES;

fn doc() -> Value {
    serde_json::from_slice(document()).expect("the document is JSON")
}

#[test]
fn the_document_has_every_row_of_routes_and_nothing_else() {
    let doc = doc();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut got = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, _) in item.as_object().unwrap() {
            got.insert((method.to_uppercase(), path.clone()));
        }
    }
    let want: BTreeSet<_> = ROUTES
        .iter()
        .map(|&(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(OPS.len(), ROUTES.len());
    for (op, row) in OPS.iter().zip(ROUTES) {
        assert_eq!((op.method, op.path), *row, "OPS in the order of ROUTES");
    }
}

#[test]
fn every_admin_code_is_in_the_document_and_every_error_answer_lists_its_codes() {
    let doc = doc();
    let listed: Vec<&str> = doc["components"]["schemas"]["Problem"]["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let mut answered = BTreeSet::new();
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for (status, r) in op["responses"].as_object().unwrap() {
                let Some(codes) = r.get("x-codes") else {
                    continue;
                };
                for c in codes.as_array().unwrap() {
                    let c = c.as_str().unwrap();
                    let code = AdminCode::ALL.iter().find(|a| a.as_str() == c).unwrap();
                    assert_eq!(code.status().as_str(), status, "{c}");
                    answered.insert(c);
                }
            }
        }
    }
    for code in AdminCode::ALL {
        let c = code.as_str();
        assert!(listed.contains(&c), "{c} in the Problem schema");
    }
    // Only `not_found` (a path, or an operation keys do not have), `method_not_allowed`, and
    // `headers_too_large` and `request_timeout` (a head over the caps, a body that did not
    // finish arriving: before any route) are not answers of a route.
    let all: BTreeSet<&str> = AdminCode::ALL.iter().map(|c| c.as_str()).collect();
    let missing: Vec<_> = all.difference(&answered).collect();
    assert_eq!(
        missing,
        [
            &"headers_too_large",
            &"method_not_allowed",
            &"not_found",
            &"request_timeout"
        ]
    );
}

#[test]
fn the_guards_are_documented_and_open_paths_need_no_token() {
    let doc = doc();
    let healthz = &doc["paths"]["/healthz"]["get"];
    assert_eq!(healthz["security"], serde_json::json!([{}]));
    assert!(healthz["responses"].get("401").is_none());
    let suspend = &doc["paths"]["/api/keys/{name}/suspend"]["post"];
    assert!(suspend["security"].is_null());
    for status in ["400", "401", "403", "404", "409", "413", "429", "503"] {
        assert!(suspend["responses"].get(status).is_some(), "{status}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["admin_token"]["scheme"],
        "bearer"
    );
}

#[test]
fn every_schema_named_is_in_the_components() {
    fn refs<'a>(v: &'a Value, out: &mut Vec<&'a str>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(r)) = m.get("$ref") {
                    out.push(r);
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let doc = doc();
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 30);
    for r in all {
        let name = r.strip_prefix("#/components/schemas/").unwrap();
        assert!(doc["components"]["schemas"].get(name).is_some(), "{r}");
    }
}

/// The parameters each `GET` with a query reads are the ones its row names: the handlers
/// take them from the table ([`query_names`]), and read each one the table gives them.
#[test]
fn the_query_each_get_reads_is_its_row_of_the_table() {
    assert_eq!(query_names("/api/usage"), ["key"]);
    assert_eq!(query_names("/api/ledger"), ["from", "to", "key"]);
    assert_eq!(
        query_names("/api/keys"),
        ["plan", "partner", "state", "source", "limit", "cursor"]
    );
    // Every other path takes none: a query there is not read at all.
    let with_query: BTreeSet<&str> = OPS
        .iter()
        .filter(|op| !op.query.is_empty())
        .map(|op| op.path)
        .collect();
    assert_eq!(
        with_query,
        BTreeSet::from(["/api/usage", "/api/ledger", "/api/keys"])
    );
}
