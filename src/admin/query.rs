//! The query of an admin `GET`, read in one place for every path that takes one
//! (`/api/keys`, `/api/ledger`, `/api/usage`): each parameter one that the path's row of the
//! OpenAPI table names ([`super::openapi::query_names`], so the document and the reader
//! cannot disagree), and given at most once. Anything else is 400 `invalid_query` naming
//! it: a filter misspelt or repeated would otherwise answer another question than the one
//! asked (`?key=a&key=b` answered the ledger's rows of `b` and the usage of `a`; `?day=…`
//! answered today's ledger). A path that takes no query and reads one strictly (the other
//! `/api/…` paths and every change: [`super::openapi::refuses_any_query`]) refuses any
//! parameter ([`none`]), before its handler.

use super::body::Refused;
use super::codes::AdminCode;
use super::openapi::query_names;
use super::reply::problem;

/// Parameters read: each by its name as the table spells it, with its value.
pub(super) type Params = Vec<(&'static str, String)>;

/// Each parameter of `query` given to `GET path`, in the order given; or the 400 that names
/// the first one unknown or repeated.
pub(super) fn read(query: Option<&str>, path: &str) -> Result<Params, Refused> {
    let known = query_names(path);
    let mut read = Params::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let Some(&name) = known.iter().find(|&&n| n == k) else {
            return Err(refused(&format!(
                "`{k}` is not a parameter of GET {path}: {}",
                known.join(", ")
            )));
        };
        if read.iter().any(|(n, _)| *n == name) {
            return Err(refused(&format!("`{name}` is given more than once")));
        }
        read.push((name, v.into_owned()));
    }
    Ok(read)
}

/// The query of `method path`, which takes none ([`super::openapi::refuses_any_query`]):
/// nothing, or the 400 that names its first parameter (`POST …/revoke?reason=leaked` would
/// otherwise revoke and drop the reason unsaid).
pub(super) fn none(query: Option<&str>, method: &str, path: &str) -> Result<(), Refused> {
    match form_urlencoded::parse(query.unwrap_or("").as_bytes()).next() {
        None => Ok(()),
        Some((k, _)) => Err(refused(&format!(
            "`{k}` is not a parameter of {method} {path}: it takes none"
        ))),
    }
}

/// 400 `invalid_query` saying `detail`.
pub(super) fn refused(detail: &str) -> Refused {
    Box::new(problem(AdminCode::InvalidQuery, detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detail(r: &http::Response<Vec<u8>>) -> String {
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["code"], "invalid_query");
        v["detail"].as_str().unwrap().to_string()
    }

    #[test]
    fn each_parameter_is_known_and_given_once() {
        assert_eq!(
            read(Some("to=2026-11-30&key=a%20b&from="), "/api/ledger").unwrap(),
            [
                ("to", "2026-11-30".into()),
                ("key", "a b".into()),
                ("from", String::new())
            ]
        );
        assert!(read(None, "/api/usage").unwrap().is_empty());
        assert!(read(Some(""), "/api/keys").unwrap().is_empty());
        for (query, path, said) in [
            ("key=a&key=b", "/api/ledger", "`key` is given more than once"),
            ("key=a&key=a", "/api/usage", "`key` is given more than once"),
            ("plan=basic&limit=2&plan=pro", "/api/keys", "`plan` is given more than once"),
            ("day=2026-11-01", "/api/ledger", "`day` is not a parameter of GET /api/ledger: from, to, key"),
            ("Key=a", "/api/usage", "`Key` is not a parameter of GET /api/usage: key"),
            ("=x", "/api/keys", "`` is not a parameter"),
            ("sort=name", "/api/keys", "`sort` is not a parameter of GET /api/keys: plan, partner, state, source, limit, cursor"),
        ] {
            let d = detail(&read(Some(query), path).unwrap_err());
            assert!(d.starts_with(said), "{query}: {d}");
        }
    }

    #[test]
    fn a_path_that_takes_no_query_refuses_any_parameter() {
        let revoke = "/api/keys/{name}/revoke";
        for query in [None, Some(""), Some("&"), Some("&&")] {
            assert!(none(query, "POST", revoke).is_ok(), "{query:?}");
        }
        for (query, said) in [
            (
                "reason=leaked",
                "`reason` is not a parameter of POST /api/keys/{name}/revoke: it takes none",
            ),
            ("force", "`force` is not"),
            ("&x=1", "`x` is not"),
        ] {
            let d = detail(&none(Some(query), "POST", revoke).unwrap_err());
            assert!(d.starts_with(said), "{query}: {d}");
        }
        // Which paths: the API's and every change; not the page, the metrics, the probes,
        // nor the three that read a query of their own.
        use crate::admin::openapi::refuses_any_query;
        for (method, path) in [
            ("POST", revoke),
            ("POST", "/api/keys"),
            ("DELETE", "/api/keys/{name}"),
            ("POST", "/reload"),
            ("GET", "/api/keys/{name}"),
            ("GET", "/api/overrides"),
            ("GET", "/api/openapi.json"),
        ] {
            assert!(refuses_any_query(method, path), "{method} {path}");
        }
        for (method, path) in [
            ("GET", "/"),
            ("GET", "/metrics"),
            ("GET", "/healthz"),
            ("GET", "/readyz"),
            ("GET", "/api/keys"),
            ("GET", "/api/ledger"),
            ("GET", "/api/usage"),
        ] {
            assert!(!refuses_any_query(method, path), "{method} {path}");
        }
    }
}
