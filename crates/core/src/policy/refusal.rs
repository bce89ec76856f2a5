//! A refusal: the one error type of the request path.
//!
//! Every policy step returns `Result<_, Refusal>`. A refusal carries its [`Code`] (which fixes
//! the HTTP status and the problem `title`), a human `detail`, and for body checks the list of
//! field errors. [`Refusal::problem_json`] renders it as RFC 9457 `application/problem+json`.

use std::borrow::Cow;

/// The contract's refusal codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Code {
    Unauthorized,
    PlanRestricted,
    WrongCredential,
    NotYourCustomer,
    UnknownRoute,
    InvalidPath,
    InvalidJson,
    InvalidBody,
    BodyTooLarge,
    UnsupportedMediaType,
    RateLimited,
    /// The client address is blocked after repeated failed authentications.
    TooManyAuthFailures,
    /// A checked body did not finish arriving in time.
    RequestTimeout,
    /// The request line and headers are over the configured caps.
    HeadersTooLarge,
    /// The request's framing or headers are ambiguous (conflicting lengths, no Host, …).
    BadRequest,
    /// A method the target does not take: `TRACE` and `CONNECT` anywhere, any other method on
    /// a checked operation's path. With `Allow`.
    MethodNotAllowed,
    /// A method the gateway does not know (an extension method, a lower-case or overlong token).
    NotImplemented,
    UpstreamUnavailable,
    UpstreamTimeout,
}

impl Code {
    /// Every code, in declaration order.
    pub const ALL: [Code; 19] = [
        Code::Unauthorized,
        Code::PlanRestricted,
        Code::WrongCredential,
        Code::NotYourCustomer,
        Code::UnknownRoute,
        Code::InvalidPath,
        Code::InvalidJson,
        Code::InvalidBody,
        Code::BodyTooLarge,
        Code::UnsupportedMediaType,
        Code::RateLimited,
        Code::TooManyAuthFailures,
        Code::RequestTimeout,
        Code::HeadersTooLarge,
        Code::BadRequest,
        Code::MethodNotAllowed,
        Code::NotImplemented,
        Code::UpstreamUnavailable,
        Code::UpstreamTimeout,
    ];

    pub fn status(self) -> u16 {
        match self {
            Code::Unauthorized => 401,
            Code::PlanRestricted | Code::WrongCredential | Code::NotYourCustomer => 403,
            Code::UnknownRoute => 404,
            Code::MethodNotAllowed => 405,
            Code::NotImplemented => 501,
            Code::InvalidPath | Code::InvalidJson | Code::InvalidBody | Code::BadRequest => 400,
            Code::BodyTooLarge => 413,
            Code::UnsupportedMediaType => 415,
            Code::RateLimited | Code::TooManyAuthFailures => 429,
            Code::RequestTimeout => 408,
            Code::HeadersTooLarge => 431,
            Code::UpstreamUnavailable => 502,
            Code::UpstreamTimeout => 504,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::Unauthorized => "unauthorized",
            Code::PlanRestricted => "plan_restricted",
            Code::WrongCredential => "wrong_credential",
            Code::NotYourCustomer => "not_your_customer",
            Code::UnknownRoute => "unknown_route",
            Code::InvalidPath => "invalid_path",
            Code::InvalidJson => "invalid_json",
            Code::InvalidBody => "invalid_body",
            Code::BodyTooLarge => "body_too_large",
            Code::UnsupportedMediaType => "unsupported_media_type",
            Code::RateLimited => "rate_limited",
            Code::TooManyAuthFailures => "too_many_auth_failures",
            Code::RequestTimeout => "request_timeout",
            Code::HeadersTooLarge => "headers_too_large",
            Code::BadRequest => "bad_request",
            Code::MethodNotAllowed => "method_not_allowed",
            Code::NotImplemented => "not_implemented",
            Code::UpstreamUnavailable => "upstream_unavailable",
            Code::UpstreamTimeout => "upstream_timeout",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Code::Unauthorized => "Unauthorized",
            Code::PlanRestricted => "Operation not in plan",
            Code::WrongCredential => "Wrong credential for this operation",
            Code::NotYourCustomer => "Not your customer",
            Code::UnknownRoute => "Unknown route",
            Code::InvalidPath => "Invalid path",
            Code::InvalidJson => "Invalid JSON",
            Code::InvalidBody => "Invalid request body",
            Code::BodyTooLarge => "Request body too large",
            Code::UnsupportedMediaType => "Unsupported media type",
            Code::RateLimited => "Rate limit exceeded",
            Code::TooManyAuthFailures => "Too many failed authentications",
            Code::RequestTimeout => "Request timeout",
            Code::HeadersTooLarge => "Request header fields too large",
            Code::BadRequest => "Bad request",
            Code::MethodNotAllowed => "Method not allowed",
            Code::NotImplemented => "Method not implemented",
            Code::UpstreamUnavailable => "Upstream unavailable",
            Code::UpstreamTimeout => "Upstream timeout",
        }
    }

    /// The problem `type` URI: a stable, documented identifier per code.
    pub fn type_uri(self) -> String {
        format!(
            "https://tollgate.dev/problems/{}",
            self.as_str().replace('_', "-")
        )
    }
}

/// One field that breaks the spec: a JSON Pointer (RFC 6901) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub pointer: String,
    pub detail: Cow<'static, str>,
}

impl FieldError {
    pub fn new(pointer: impl Into<String>, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            pointer: pointer.into(),
            detail: detail.into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: Code,
    pub detail: Cow<'static, str>,
    pub errors: Vec<FieldError>,
    /// Seconds the client should wait (429 only: `Retry-After`).
    pub retry_after: Option<u64>,
    /// The methods the target takes (405 only: `Allow`).
    pub allow: Option<Cow<'static, str>>,
}

impl Refusal {
    pub fn new(code: Code, detail: impl Into<Cow<'static, str>>) -> Self {
        Self {
            code,
            detail: detail.into(),
            errors: Vec::new(),
            retry_after: None,
            allow: None,
        }
    }

    pub fn unauthorized() -> Self {
        Self::new(Code::Unauthorized, "a valid bearer key is required")
    }

    pub fn status(&self) -> u16 {
        self.code.status()
    }

    /// The RFC 9457 body.
    pub fn problem_json(&self) -> String {
        let mut v = serde_json::json!({
            "type": self.code.type_uri(),
            "title": self.code.title(),
            "status": self.code.status(),
            "detail": self.detail,
            "code": self.code.as_str(),
        });
        if !self.errors.is_empty() {
            v["errors"] = self
                .errors
                .iter()
                .map(|e| serde_json::json!({ "pointer": e.pointer, "detail": e.detail }))
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
        // `method_not_allowed` and `not_implemented` for methods).
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
            ("too_many_auth_failures", 429),
            ("request_timeout", 408),
            ("headers_too_large", 431),
            ("bad_request", 400),
            ("method_not_allowed", 405),
            ("not_implemented", 501),
            ("upstream_unavailable", 502),
            ("upstream_timeout", 504),
        ];
        // Every code is in the table exactly once, and the table has no code that is not one.
        assert_eq!(Code::ALL.len(), table.len());
        for c in Code::ALL {
            let row: Vec<_> = table.iter().filter(|(n, _)| *n == c.as_str()).collect();
            assert_eq!(row.len(), 1, "{c:?} is not in the table once");
            assert_eq!(c.status(), row[0].1, "{c:?}");
        }
        // `ALL` lists each variant once: a variant added to the enum without being added to
        // `ALL` fails to compile in `exhaustive` below.
        fn exhaustive(c: Code) -> usize {
            match c {
                Code::Unauthorized
                | Code::PlanRestricted
                | Code::WrongCredential
                | Code::NotYourCustomer
                | Code::UnknownRoute
                | Code::InvalidPath
                | Code::InvalidJson
                | Code::InvalidBody
                | Code::BodyTooLarge
                | Code::UnsupportedMediaType
                | Code::RateLimited
                | Code::TooManyAuthFailures
                | Code::RequestTimeout
                | Code::HeadersTooLarge
                | Code::BadRequest
                | Code::MethodNotAllowed
                | Code::NotImplemented
                | Code::UpstreamUnavailable
                | Code::UpstreamTimeout => 19,
            }
        }
        assert_eq!(exhaustive(Code::ALL[0]), Code::ALL.len());
        let distinct: std::collections::HashSet<_> = Code::ALL.iter().collect();
        assert_eq!(distinct.len(), Code::ALL.len());
    }
}
