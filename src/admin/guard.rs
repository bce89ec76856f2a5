//! What the admin listener checks before it answers: that it was called by its own name (no
//! DNS rebinding), that a state-changing request is not a cross-site one (no CSRF), and that a
//! client guessing the token is slowed to a stop.
//!
//! | check | refused with | applies to |
//! |---|---|---|
//! | `Host`: an IP literal, `localhost` (or a name under it), or a name in `admin_hosts` | 403 `host_not_allowed` | every path but `/healthz` and `/readyz` |
//! | cross-site: `Sec-Fetch-Site` other than `same-origin` or `none`, else an `Origin` whose host is not the `Host` | 403 `cross_origin` | `POST`, `PUT`, `PATCH`, `DELETE` |
//! | token guessing: [`TOKEN_FAILURES`] wrong tokens from one address | 429 `too_many_auth_failures`, `Retry-After` (even with the right token) | every path that needs the token |
//! | the token itself (with `admin_token_sha256`): `Authorization: Bearer <token>` | 401 `unauthorized`, `WWW-Authenticate` (a browser asking for `/` gets the page, which asks for the token) | every path but `/healthz` and `/readyz` |
//!
//! [`Admin::refusal`] runs them in the order of the table, before any route is looked up.
//!
//! A browser on a page of another site can neither name the listener by a host it controls
//! (rebinding an attacker's name to 127.0.0.1: its `Host` is that name) nor post a form to it
//! (its `Origin`, or `Sec-Fetch-Site: cross-site`, says where it came from); tools that send
//! neither header (curl, Prometheus, `tollgate top`) are not affected. This is the rule of Go's
//! `http.CrossOriginProtection` and of the dev servers' host checks (Vite, webpack).

use std::net::IpAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderMap, Method, Response, StatusCode};
use pingora::http::RequestHeader;

use super::codes::AdminCode;
use super::reply::{bearer_matches, page, problem};
use super::Admin;
use crate::config::{AuthFailures, Config};
use crate::digest::Digest;
use crate::policy::client::ClientKey;

/// Wrong admin tokens from one address: 10 within a minute block it for a minute.
pub(crate) const TOKEN_FAILURES: AuthFailures = AuthFailures {
    max_failures: match NonZeroU32::new(10) {
        Some(n) => n,
        None => NonZeroU32::MIN,
    },
    window: Duration::from_secs(60),
    block: Duration::from_secs(60),
    max_tracked_ips: match NonZeroUsize::new(10_000) {
        Some(n) => n,
        None => NonZeroUsize::MIN,
    },
};

/// Whether `headers`' `Host` names this listener: an IP literal, `localhost` or a name under
/// it, or one of `allowed` (lower case; `*.suffix` for every name under `suffix`). A request
/// without `Host` (HTTP/1.0 tools) passes: a browser always sends one.
pub(crate) fn host_allowed(headers: &HeaderMap, allowed: &[String]) -> bool {
    let Some(host) = headers.get(http::header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = strip_port(host.trim());
    if name.starts_with('[') {
        return name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .is_some_and(|n| n.parse::<IpAddr>().is_ok());
    }
    if name.parse::<IpAddr>().is_ok() {
        return true;
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || allowed.iter().any(|a| match a.strip_prefix('*') {
            // `*.example.internal`: a name under it (`.example.internal` ends it).
            Some(suffix) => name.ends_with(suffix),
            None => *a == name,
        })
}

/// `host[:port]` without the port (an IPv6 literal keeps its brackets).
fn strip_port(host: &str) -> &str {
    match host.rfind(':') {
        Some(i)
            if host[i + 1..].bytes().all(|b| b.is_ascii_digit()) && !host[..i].ends_with(':') =>
        {
            // `[::1]:9091` → `[::1]`; `::1` alone (no brackets) is not a Host a client sends.
            &host[..i]
        }
        _ => host,
    }
}

/// Whether a request that changes state comes from another site: `Sec-Fetch-Site` says so
/// (anything but `same-origin` or `none`), or, without it, an `Origin` names another host than
/// `Host` (or is `null`). Safe methods are never cross-origin requests in this sense.
pub(crate) fn cross_origin(method: &Method, headers: &HeaderMap) -> bool {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return false;
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        return !matches!(site.as_bytes(), b"same-origin" | b"none");
    }
    let Some(origin) = headers.get(http::header::ORIGIN) else {
        return false;
    };
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest.split('/').next().unwrap_or(rest));
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::trim);
    match (origin_host, host) {
        (Some(o), Some(h)) => !o.eq_ignore_ascii_case(h),
        _ => true,
    }
}

impl Admin {
    /// The guards, in this order: the host (not for `/healthz` and `/readyz`), a cross-site
    /// change, the admin token (when `admin_token_sha256` is set; not for `/healthz` and
    /// `/readyz`). The answer that refuses the request, or `None` to route it.
    pub(super) fn refusal(
        &self,
        req: &RequestHeader,
        client: Option<ClientKey>,
        config: &Config,
    ) -> Option<Response<Vec<u8>>> {
        let open = matches!(req.uri.path(), "/healthz" | "/readyz");
        if !open && !host_allowed(&req.headers, &config.admin_hosts) {
            return Some(problem(
                AdminCode::HostNotAllowed,
                "call it by an address, `localhost`, or a name listed in `admin_hosts`",
            ));
        }
        if cross_origin(&req.method, &req.headers) {
            return Some(problem(
                AdminCode::CrossOrigin,
                "state-changing requests are refused when they come from another site \
                 (Origin, Sec-Fetch-Site)",
            ));
        }
        match config.admin_token {
            Some(want) if !open => self.token_refusal(req, client, &want),
            _ => None,
        }
    }

    /// The admin token: the answer that refuses the request, or `None` when it carries the
    /// token. A wrong one counts against the client's address ([`TOKEN_FAILURES`]); a
    /// blocked address is refused whatever it sends, so a right guess during the block does
    /// not show.
    fn token_refusal(
        &self,
        req: &RequestHeader,
        client: Option<ClientKey>,
        want: &Digest,
    ) -> Option<Response<Vec<u8>>> {
        let now = self.clock.now();
        if let Some(secs) = client.and_then(|c| self.failures.blocked(c, now)) {
            let mut r = problem(
                AdminCode::TooManyAuthFailures,
                &format!("retry in {secs} s"),
            );
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, secs.into());
            return Some(r);
        }
        let presented = req.headers.get(AUTHORIZATION);
        if bearer_matches(presented, want) {
            return None;
        }
        if let (Some(c), Some(_)) = (client, presented) {
            if let Some(b) = self.failures.failed(c, now, &TOKEN_FAILURES) {
                tracing::warn!(
                    target: "tollgate::admin",
                    client = %b.key.display(),
                    seconds = b.duration.as_secs(),
                    "admin listener: address blocked after repeated wrong tokens"
                );
            }
        }
        // The page itself holds no data: a browser (one that asks for HTML) gets it, and it
        // asks for the token; every other client gets problem+json.
        let browser = req
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/html"));
        let mut r = if req.uri.path() == "/" && browser {
            page(StatusCode::UNAUTHORIZED)
        } else {
            problem(
                AdminCode::Unauthorized,
                "send `Authorization: Bearer <token>` (admin_token_sha256 is set)",
            )
        };
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"tollgate-admin\""),
        );
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_listener_answers_to_addresses_localhost_and_listed_names_only() {
        let listed = vec![
            "tollgate-admin.monitoring.svc".to_string(),
            "*.gateways.internal".to_string(),
        ];
        for host in [
            "127.0.0.1:9091",
            "127.0.0.1",
            "10.1.2.3:9091",
            "[::1]:9091",
            "[::1]",
            "localhost:9091",
            "LOCALHOST",
            "localhost.",
            "app.localhost:9091",
            "tollgate-admin.monitoring.svc:9091",
            "Tollgate-Admin.Monitoring.Svc",
            "gw-1.gateways.internal:9091",
            "a.b.gateways.internal",
        ] {
            assert!(host_allowed(&headers(&[("host", host)]), &listed), "{host}");
        }
        assert!(host_allowed(&HeaderMap::new(), &listed), "no Host");
        for host in [
            "attacker.example:9091",
            "attacker.example",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "[not-an-ip]",
            "monitoring.svc",
            "gateways.internal",
            "evilgateways.internal",
            "",
        ] {
            assert!(
                !host_allowed(&headers(&[("host", host)]), &listed),
                "{host}"
            );
        }
    }

    #[test]
    fn a_cross_site_form_cannot_change_state_and_tools_are_not_affected() {
        let post = Method::POST;
        // curl, Prometheus, `tollgate top`: no Origin, no Sec-Fetch-Site.
        assert!(!cross_origin(
            &post,
            &headers(&[("host", "127.0.0.1:9091")])
        ));
        // The usage page itself.
        assert!(!cross_origin(
            &post,
            &headers(&[
                ("host", "127.0.0.1:9091"),
                ("origin", "http://127.0.0.1:9091")
            ])
        ));
        assert!(!cross_origin(
            &Method::DELETE,
            &headers(&[("sec-fetch-site", "same-origin"), ("origin", "http://x")])
        ));
        for h in [
            vec![
                ("host", "127.0.0.1:9091"),
                ("origin", "https://attacker.example"),
            ],
            vec![("host", "127.0.0.1:9091"), ("origin", "null")],
            vec![
                ("host", "127.0.0.1:9091"),
                ("origin", "http://127.0.0.1:9092"),
            ],
            vec![("origin", "http://127.0.0.1:9091")],
            vec![("sec-fetch-site", "cross-site")],
            vec![
                ("sec-fetch-site", "same-site"),
                ("origin", "http://127.0.0.1:9091"),
                ("host", "127.0.0.1:9091"),
            ],
        ] {
            assert!(cross_origin(&post, &headers(&h)), "{h:?}");
            assert!(cross_origin(&Method::PUT, &headers(&h)), "{h:?}");
        }
        // Reading is never refused for it (the page's data needs the token anyway).
        assert!(!cross_origin(
            &Method::GET,
            &headers(&[("sec-fetch-site", "cross-site")])
        ));
    }
}
