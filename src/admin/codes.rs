//! The admin listener's problem codes: one row each (variant, HTTP status, `code`, `title`),
//! the sibling of the request path's [`crate::policy::Code`] table. Every problem the admin
//! listener writes names an [`AdminCode`]; [`super::reply::problem`] turns it into RFC 9457
//! problem+json with the same `type` URI spelling as the request path's.
//!
//! A code that is also a refusal code of the request path (`unauthorized`, `invalid_json`,
//! `invalid_body`, `headers_too_large`, `body_too_large`, `request_timeout`,
//! `method_not_allowed`, `too_many_auth_failures`) is spelled
//! as that one and answers its status (a unit test keeps both); its title says what it means
//! here.

use http::StatusCode;

/// One row per admin problem: the variant, its status (a [`StatusCode`] constant), its `code`
/// and its `title`. [`AdminCode::ALL`], [`AdminCode::status`], [`AdminCode::as_str`] and
/// [`AdminCode::title`] are derived from the rows.
macro_rules! admin_codes {
    ($($(#[$doc:meta])* $code:ident => $status:ident, $name:literal, $title:literal;)*) => {
        /// Why the admin listener refused a request (the problem's `code`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub(crate) enum AdminCode {
            $($(#[$doc])* $code,)*
        }

        impl AdminCode {
            /// Every row, in the order of the table.
            #[cfg_attr(not(test), allow(dead_code))]
            pub(crate) const ALL: &'static [AdminCode] = &[$(AdminCode::$code),*];

            /// The HTTP status of the answer.
            pub(crate) fn status(self) -> StatusCode {
                match self { $(AdminCode::$code => StatusCode::$status,)* }
            }

            /// The problem's `code` (`unknown_key`).
            pub(crate) fn as_str(self) -> &'static str {
                match self { $(AdminCode::$code => $name,)* }
            }

            /// The problem's `title`.
            pub(crate) fn title(self) -> &'static str {
                match self { $(AdminCode::$code => $title,)* }
            }
        }
    };
}

admin_codes! {
    // The guards (`guard.rs`), before any route.
    /// `Host` is not an address, `localhost` or a name in `admin_hosts` (no DNS rebinding).
    HostNotAllowed => FORBIDDEN, "host_not_allowed", "The admin listener does not answer to that host name";
    /// A state-changing request from another site (no CSRF).
    CrossOrigin => FORBIDDEN, "cross_origin", "A cross-site request cannot change the gateway";
    /// The address sent too many wrong admin tokens. With `Retry-After`.
    TooManyAuthFailures => TOO_MANY_REQUESTS, "too_many_auth_failures", "Too many wrong admin tokens from this address";
    /// No admin token, or a wrong one. With `WWW-Authenticate`.
    Unauthorized => UNAUTHORIZED, "unauthorized", "The admin listener needs its bearer token";

    // `POST /reload`.
    /// The new config was refused (with `file`, `line`, `field`); the old one keeps serving.
    ConfigRefused => UNPROCESSABLE_ENTITY, "config_refused", "The config was refused; the previous one keeps serving";

    // `DELETE /api/overrides/{name}`.
    /// The key has no plan override.
    NoOverride => NOT_FOUND, "no_override", "No plan override for that key";

    // `DELETE /api/blocks/{address}`.
    /// The address is not blocked (or is not an address).
    NotBlocked => NOT_FOUND, "not_blocked", "That address is not blocked";

    // `GET /api/ledger` and `GET /api/keys`.
    /// A query parameter is not one the route takes, or its value is not one it can be (a
    /// day out of order, a plan no config has, a page size out of range).
    InvalidQuery => BAD_REQUEST, "invalid_query", "Invalid query";
    /// The store of the ledger cannot be read.
    LedgerUnavailable => SERVICE_UNAVAILABLE, "ledger_unavailable", "The ledger cannot be read";

    // `/api/keys/…`.
    /// A request line and header fields over `server.max_header_bytes` or `max_headers`.
    HeadersTooLarge => REQUEST_HEADER_FIELDS_TOO_LARGE, "headers_too_large", "The request's head is too large";
    /// A body over the admin listener's cap.
    BodyTooLarge => PAYLOAD_TOO_LARGE, "body_too_large", "The body is too large";
    /// A body its framing promised that did not finish arriving (within `body_timeout`, or
    /// before the client closed): nothing is changed on what came of it.
    RequestTimeout => REQUEST_TIMEOUT, "request_timeout", "The body did not finish arriving";
    /// An operation on a key that is not one of the table's.
    NoKeyOperation => NOT_FOUND, "not_found", "No such key operation";
    /// A path the admin listener does not answer.
    NoRoute => NOT_FOUND, "not_found", "No such path";
    /// A method the path does not take (with `Allow`).
    MethodNotAllowed => METHOD_NOT_ALLOWED, "method_not_allowed", "The path does not take that method";
    /// A body that is not JSON.
    InvalidJson => BAD_REQUEST, "invalid_json", "The body is not JSON";
    /// A field of the body breaks its rule (with `errors`, as the request path's).
    InvalidBody => BAD_REQUEST, "invalid_body", "A field of the body is invalid";
    /// No key or partner has that name.
    UnknownKey => NOT_FOUND, "unknown_key", "No key has that name";
    /// No key has that secret (`POST /api/keys/revoke`): the same code as [`AdminCode::UnknownKey`].
    UnknownSecret => NOT_FOUND, "unknown_key", "No key is that secret";
    /// A revoked key is not resumed.
    KeyRevoked => CONFLICT, "key_revoked", "The key is revoked";
    /// A limit or a quota of its own for a partner key.
    NotACustomerKey => BAD_REQUEST, "not_a_customer_key", "Partner keys have no limit or quota of their own";
    /// A partner's resume of a key the operator suspended.
    SuspendedByOperator => CONFLICT, "suspended_by_operator", "The operator suspended the key";
    /// A new key's name, or its digest, is a key's (in the YAML or issued), or was (a revoked
    /// digest never authenticates again).
    KeyExists => CONFLICT, "key_exists", "A key with that name or digest exists";
    /// `rotate` or `DELETE` of a key the YAML defines: it rotates (with `previous`) and leaves
    /// in the YAML.
    DefinedInConfig => CONFLICT, "defined_in_config", "The key is defined in the config";
    /// The store could not keep an operator's change (to a key, or an override removed); it was
    /// made nowhere.
    ChangeNotKept => SERVICE_UNAVAILABLE, "change_not_kept", "The change could not be kept, and was not made";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Code;

    #[test]
    fn a_code_the_request_path_has_too_is_spelled_and_answered_as_there() {
        let mut shared = Vec::new();
        for a in AdminCode::ALL {
            if let Some(c) = Code::ALL.iter().find(|c| c.as_str() == a.as_str()) {
                assert_eq!(a.status().as_u16(), c.status(), "{a:?}");
                assert_eq!(
                    format!("{a:?}"),
                    format!("{c:?}"),
                    "one variant name per code"
                );
                shared.push(a.as_str());
            }
        }
        assert_eq!(
            shared,
            [
                "too_many_auth_failures",
                "unauthorized",
                "headers_too_large",
                "body_too_large",
                "request_timeout",
                "method_not_allowed",
                "invalid_json",
                "invalid_body"
            ]
        );
    }

    #[test]
    fn codes_are_snake_case_and_only_unknown_key_and_not_found_have_two_titles() {
        for a in AdminCode::ALL {
            let s = a.as_str();
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
            assert!(a.status().is_client_error() || a.status().is_server_error());
            let same: Vec<_> = AdminCode::ALL.iter().filter(|b| b.as_str() == s).collect();
            let expected = if matches!(s, "unknown_key" | "not_found") {
                2
            } else {
                1
            };
            assert_eq!(same.len(), expected, "{s}");
        }
    }
}
