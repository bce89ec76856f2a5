//! A refusal: the one error type of the request path.
//!
//! Every policy step returns `Result<_, Refusal>`. A refusal carries its [`Code`] (which fixes
//! the HTTP status and the problem `title`), a human `detail`, and for body checks the list of
//! field errors. [`Refusal::problem_json`] renders it as RFC 9457 `application/problem+json`.

use std::borrow::Cow;

use crate::outcome::Outcome;

/// One row per refusal code: the variant, its HTTP status, its name (the problem's `code`), its
/// problem `title`, and the [`Outcome`] a request refused with it ends as. Everything else about
/// a code ([`Code::ALL`], [`Code::status`], [`Code::as_str`], [`Code::title`],
/// [`Code::outcome`], the `type` URI) is derived from its row.
macro_rules! codes {
    ($($(#[$doc:meta])* $code:ident => $status:literal, $name:literal, $title:literal, $outcome:ident;)*) => {
        /// Why the gateway refused a request (the problem's `code`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Code {
            $($(#[$doc])* $code,)*
        }

        impl Code {
            /// Every code, in the order of the table.
            pub const ALL: &'static [Code] = &[$(Code::$code),*];

            /// The HTTP status of the answer.
            pub fn status(self) -> u16 {
                match self { $(Code::$code => $status,)* }
            }

            /// The code's name: the problem's `code` (`plan_restricted`).
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$code => $name,)* }
            }

            /// The problem's `title`, the same for every refusal with this code.
            pub fn title(self) -> &'static str {
                match self { $(Code::$code => $title,)* }
            }

            /// How a request refused with this code ends, for logs and metrics.
            pub fn outcome(self) -> Outcome {
                match self { $(Code::$code => Outcome::$outcome,)* }
            }
        }
    };
}

codes! {
    /// No, a malformed, or an unknown bearer key: one answer for every way of failing.
    Unauthorized => 401, "unauthorized", "Unauthorized", Unauthorized;
    /// The key's plan does not allow this operation.
    PlanRestricted => 403, "plan_restricted", "Operation not in plan", Forbidden;
    /// A customer key on a partner operation, or a partner key on a customer one.
    WrongCredential => 403, "wrong_credential", "Wrong credential for this operation", Forbidden;
    /// A partner acts on a customer key that another partner manages, or that the gateway
    /// does not know.
    NotYourCustomer => 403, "not_your_customer", "Not your customer", Forbidden;
    /// No route: outside `/v2/`, an unknown partner operation, or a near spelling of a checked
    /// operation.
    UnknownRoute => 404, "unknown_route", "Unknown route", NotFound;
    /// An ambiguous path (dot or empty segments, encoded delimiters, …: [`crate::path`]).
    InvalidPath => 400, "invalid_path", "Invalid path", Invalid;
    /// A checked body that is not one JSON document, or repeats a member name (in any case).
    InvalidJson => 400, "invalid_json", "Invalid JSON", Invalid;
    /// A checked body with fields that break the spec (listed in `errors`).
    InvalidBody => 400, "invalid_body", "Invalid request body", Invalid;
    /// A body over the configured cap (`limits.max_body_bytes`, or
    /// `limits.max_validated_body_bytes` for a checked body).
    BodyTooLarge => 413, "body_too_large", "Request body too large", Invalid;
    /// A checked operation without `Content-Type: application/json`.
    UnsupportedMediaType => 415, "unsupported_media_type", "Unsupported media type", Invalid;
    /// Over the key's window limit. With `Retry-After`.
    RateLimited => 429, "rate_limited", "Rate limit exceeded", RateLimited;
    /// Over the key's quota for its calendar period. With `Retry-After` to the period's end.
    QuotaExhausted => 429, "quota_exhausted", "Quota exhausted", QuotaExhausted;
    /// The client address is blocked after repeated failed authentications.
    TooManyAuthFailures => 429, "too_many_auth_failures", "Too many failed authentications", Blocked;
    /// A checked body did not finish arriving in time.
    RequestTimeout => 408, "request_timeout", "Request timeout", Timeout;
    /// The request line and headers are over the configured caps.
    HeadersTooLarge => 431, "headers_too_large", "Request header fields too large", Invalid;
    /// The request's framing or headers are ambiguous (conflicting lengths, no Host, …).
    BadRequest => 400, "bad_request", "Bad request", Invalid;
    /// A method the target does not take: `TRACE` and `CONNECT` anywhere, any other method on
    /// a checked operation's path. With `Allow`.
    MethodNotAllowed => 405, "method_not_allowed", "Method not allowed", Invalid;
    /// A method the gateway does not know (an extension method, a lower-case or overlong token).
    NotImplemented => 501, "not_implemented", "Method not implemented", Invalid;
    /// An HTTP/2 request over the caps of requests in flight (`server.max_connections_per_ip`
    /// from its address, `server.max_connections` in all), which count HTTP/2 requests as
    /// connections. With `Retry-After`.
    TooManyStreams => 503, "too_many_streams", "Too many requests in flight", Invalid;
    /// The upstream cannot be reached or breaks the connection.
    UpstreamUnavailable => 502, "upstream_unavailable", "Upstream unavailable", UpstreamError;
    /// The upstream does not answer in time.
    UpstreamTimeout => 504, "upstream_timeout", "Upstream timeout", UpstreamError;
}

impl Code {
    /// The problem `type` URI: a stable, documented identifier per code.
    pub fn type_uri(self) -> String {
        problem_type(self.as_str())
    }
}

/// The `type` URI of the problem named `code` (`invalid_body` →
/// `https://tollgate.dev/problems/invalid-body`): the one spelling of every problem type, the
/// request path's and the admin listener's.
pub fn problem_type(code: &str) -> String {
    format!("https://tollgate.dev/problems/{}", code.replace('_', "-"))
}

/// An RFC 9457 problem object with Tollgate's `code`: the one writer of problems, for the
/// request path ([`Refusal::problem_json`]) and the admin listener alike.
pub fn problem(status: u16, code: &str, title: &str, detail: &str) -> serde_json::Value {
    serde_json::json!({
        "type": problem_type(code),
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    })
}

/// One field that breaks the spec: a JSON Pointer (RFC 6901) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field, as a JSON Pointer (`/eventOptions/callType`; `""`: the whole document).
    pub pointer: String,
    /// What is wrong with it.
    pub detail: Cow<'static, str>,
    /// A query parameter instead of a body field (its name as sent): the answer names it as
    /// `parameter`, as JSON:API's `source.parameter` does.
    pub parameter: Option<String>,
}

impl FieldError {
    /// The error `detail` at `pointer`.
    pub fn new(pointer: impl Into<String>, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            pointer: pointer.into(),
            detail: detail.into(),
            parameter: None,
        }
    }

    /// The error `detail` of the query parameter `name`.
    pub fn parameter(name: impl Into<String>, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            pointer: String::new(),
            detail: detail.into(),
            parameter: Some(name.into()),
        }
    }
}

/// Why a request is refused, and what the answer carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The code: fixes the status and the problem's `title`.
    pub code: Code,
    /// The problem's `detail`, for the client.
    pub detail: Cow<'static, str>,
    /// The fields that break the spec (`invalid_body` only; empty otherwise).
    pub errors: Vec<FieldError>,
    /// Seconds the client should wait (429 only: `Retry-After`).
    pub retry_after: Option<u64>,
    /// The methods the target takes (405 only: `Allow`).
    pub allow: Option<Cow<'static, str>>,
}

impl Refusal {
    /// A refusal with `code` and `detail`, and nothing else.
    pub fn new(code: Code, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            detail: detail.into(),
            errors: Vec::new(),
            retry_after: None,
            allow: None,
        }
    }

    /// The `401 unauthorized` refusal: the one answer to every failed authentication.
    pub fn unauthorized() -> Self {
        Self::new(Code::Unauthorized, "a valid bearer key is required")
    }

    /// The HTTP status of the answer (the code's).
    pub fn status(&self) -> u16 {
        self.code.status()
    }

    /// The RFC 9457 body.
    pub fn problem_json(&self) -> String {
        let c = self.code;
        let mut v = problem(c.status(), c.as_str(), c.title(), &self.detail);
        if !self.errors.is_empty() {
            v["errors"] = self
                .errors
                .iter()
                .map(|e| match &e.parameter {
                    Some(p) => serde_json::json!({ "parameter": p, "detail": e.detail }),
                    None => serde_json::json!({ "pointer": e.pointer, "detail": e.detail }),
                })
                .collect();
        }
        if let Some(s) = self.retry_after {
            v["retry_after"] = s.into();
        }
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_the_contract_outcomes() {
        for &code in Code::ALL {
            let want = match code.status() {
                _ if code == Code::TooManyAuthFailures => "blocked",
                _ if code == Code::QuotaExhausted => "quota_exhausted",
                408 => "timeout",
                401 => "unauthorized",
                403 => "forbidden",
                404 => "not_found",
                429 => "rate_limited",
                502 | 504 => "upstream_error",
                _ => "invalid",
            };
            assert_eq!(code.outcome().as_str(), want, "{code:?}");
        }
    }

    #[test]
    fn problem_json_has_the_contract_fields() {
        let mut r = Refusal::new(Code::InvalidBody, "the body breaks the spec");
        r.errors.push(FieldError::new("/startTime", "must be …"));
        let v: serde_json::Value = serde_json::from_str(&r.problem_json()).unwrap();
        assert_eq!(v["status"], 400);
        assert_eq!(v["code"], "invalid_body");
        assert_eq!(v["title"], "Invalid request body");
        assert!(v["type"].as_str().unwrap().ends_with("/invalid-body"));
        assert_eq!(v["errors"][0]["pointer"], "/startTime");
    }

    #[test]
    fn statuses_match_the_contract_table() {
        // The contract's table (and Tollgate's own: `bad_request` for ambiguous framing,
        // `method_not_allowed` and `not_implemented` for methods, `too_many_streams` for
        // HTTP/2 requests in flight over the connections' caps).
        let table = [
            ("unauthorized", 401),
            ("plan_restricted", 403),
            ("wrong_credential", 403),
            ("not_your_customer", 403),
            ("unknown_route", 404),
            ("invalid_path", 400),
            ("invalid_json", 400),
            ("invalid_body", 400),
            ("body_too_large", 413),
            ("unsupported_media_type", 415),
            ("rate_limited", 429),
            ("quota_exhausted", 429),
            ("too_many_auth_failures", 429),
            ("request_timeout", 408),
            ("headers_too_large", 431),
            ("bad_request", 400),
            ("method_not_allowed", 405),
            ("not_implemented", 501),
            ("too_many_streams", 503),
            ("upstream_unavailable", 502),
            ("upstream_timeout", 504),
        ];
        // Every code is in the table exactly once, and the table has no code that is not one.
        assert_eq!(Code::ALL.len(), table.len());
        for &c in Code::ALL {
            let row: Vec<_> = table.iter().filter(|(n, _)| *n == c.as_str()).collect();
            assert_eq!(row.len(), 1, "{c:?} is not in the table once");
            assert_eq!(c.status(), row[0].1, "{c:?}");
        }
        // `ALL` is derived from the same rows as the enum: it lists every variant, once.
        let distinct: std::collections::HashSet<_> = Code::ALL.iter().collect();
        assert_eq!(distinct.len(), Code::ALL.len());
    }
}
