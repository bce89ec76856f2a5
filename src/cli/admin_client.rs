//! A client of the admin listener's JSON API (`tollgate keys`): one call, its answer or the
//! problem's `detail`; every page of a list.

use serde_json::{json, Value};

/// What one call of the API came to: its JSON, or the words for stderr.
pub(super) type Answer = Result<Value, String>;

/// The admin listener at `base`.
pub(super) struct Client {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    pub(super) fn new(base: &str) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(30)))
            .build()
            .into();
        Self {
            base: base.trim_end_matches('/').to_string(),
            token: std::env::var("TOLLGATE_ADMIN_TOKEN").ok(),
            agent,
        }
    }

    /// `method path` with `body` (JSON, when given).
    pub(super) fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Answer {
        let url = format!("{}{path}", self.base);
        let mut req = http::Request::builder().method(method).uri(&url);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let sent = match body {
            Some(b) => req
                .header("content-type", "application/json")
                .body(b.to_string())
                .map_err(|e| e.to_string())
                .and_then(|r| self.agent.run(r).map_err(|e| e.to_string())),
            None => req
                .body(())
                .map_err(|e| e.to_string())
                .and_then(|r| self.agent.run(r).map_err(|e| e.to_string())),
        };
        let mut resp =
            sent.map_err(|e| format!("cannot reach the admin listener at {url}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("{url}: {e}"))?;
        let value: Option<Value> = serde_json::from_str(&text).ok();
        if (200..300).contains(&status) {
            return Ok(value.unwrap_or(Value::Null));
        }
        Err(match value.as_ref().and_then(|v| v["detail"].as_str()) {
            Some(detail) => detail.to_string(),
            None => format!("{method} {path}: HTTP {status}: {}", text.trim()),
        })
    }
}

/// A path segment with what a URL escapes escaped (a key name may hold `/` or spaces).
pub(super) fn segment(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Every page of `GET /api/keys` with `filters`, as one list.
pub(super) fn list_all(c: &Client, filters: &[(&str, &Option<String>)]) -> Answer {
    let mut query: Vec<String> = filters
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", segment(v))))
        .collect();
    query.push("limit=1000".into());
    let mut keys = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut q = query.clone();
        if let Some(c) = &cursor {
            q.push(format!("cursor={c}"));
        }
        let page = c.call("GET", &format!("/api/keys?{}", q.join("&")), None)?;
        keys.extend(page["keys"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return Ok(json!({ "keys": keys, "next": null })),
        }
    }
}
