//! The method: which request methods reach the upstream at all (step 0, with the framing).
//!
//! Only the methods an HTTP API is called with are forwarded: `GET`, `HEAD`, `POST`, `PUT`,
//! `PATCH`, `DELETE` and `OPTIONS`. Methods are case-sensitive (RFC 9110 section 9.1), and
//! upstream frameworks differ in what they make of the rest, so nothing else is passed on:
//!
//! | method | answer | why |
//! |---|---|---|
//! | `TRACE` | `405 method_not_allowed`, `Allow` | it echoes the request (credentials included) back, and a proxy must not forward it with `Max-Forwards: 0` (RFC 9110 section 7.6.2); nginx refuses it likewise |
//! | `CONNECT` | `405 method_not_allowed`, `Allow` | a tunnel; never forwarded |
//! | anything else: an extension method (`PURGE`, `PROPFIND`), a lower-case spelling (`post`), an overlong token | `501 not_implemented` | unknown to the gateway (RFC 9110 section 15.6.2); an upstream that folded `post` to `POST` would run a checked operation unchecked |
//!
//! A checked operation's own path takes only the methods its routes name; that rule needs the
//! route and lives with classification ([`crate::config::routes::Catalogue::guard`]).

use crate::refusal::{Code, Refusal};

/// The methods forwarded, as `Allow` lists them.
pub const FORWARDED: &str = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";

/// Admit `method` or refuse it.
pub fn check_method(method: &str) -> Result<(), Refusal> {
    match method {
        "GET" | "POST" | "HEAD" | "PUT" | "PATCH" | "DELETE" | "OPTIONS" => Ok(()),
        "TRACE" | "CONNECT" => {
            let mut r = Refusal::new(
                Code::MethodNotAllowed,
                format!("{method} is never forwarded"),
            );
            r.allow = Some(FORWARDED.into());
            Err(r)
        }
        _ => Err(Refusal::new(
            Code::NotImplemented,
            format!("the gateway forwards only {FORWARDED} (methods are case-sensitive)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_api_methods_pass() {
        for m in ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            assert!(check_method(m).is_ok(), "{m}");
        }
        for m in ["TRACE", "CONNECT"] {
            let r = check_method(m).unwrap_err();
            assert_eq!(
                (r.code, r.allow.as_deref()),
                (Code::MethodNotAllowed, Some(FORWARDED))
            );
        }
        let long = "P".repeat(4096);
        for m in [
            "post",
            "Post",
            "get",
            "PURGE",
            "PROPFIND",
            "M-SEARCH",
            "",
            long.as_str(),
        ] {
            assert_eq!(
                check_method(m).unwrap_err().code,
                Code::NotImplemented,
                "{m:.20}"
            );
        }
    }
}
