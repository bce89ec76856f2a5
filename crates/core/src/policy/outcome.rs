//! How a request ended: the `outcome` label of `tollgate_requests_total` and the access log.

use super::refusal::Code;

/// How a request ended, for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    #[default]
    Forwarded,
    Unauthorized,
    Forbidden,
    RateLimited,
    Invalid,
    NotFound,
    UpstreamError,
    /// Refused because the client address is blocked (failed authentications).
    Blocked,
    /// A deadline of the edge ended the request (a checked body too slow to arrive).
    Timeout,
    /// Forwarded, though the plan's limit would have refused it (the plan is in shadow mode).
    ShadowRateLimited,
    /// Forwarded, though the plan's allow-list would have refused it (shadow mode).
    ShadowForbidden,
}

impl Outcome {
    /// Every outcome, in discriminant order.
    pub const ALL: [Outcome; 11] = [
        Outcome::Forwarded,
        Outcome::Unauthorized,
        Outcome::Forbidden,
        Outcome::RateLimited,
        Outcome::Invalid,
        Outcome::NotFound,
        Outcome::UpstreamError,
        Outcome::Blocked,
        Outcome::Timeout,
        Outcome::ShadowRateLimited,
        Outcome::ShadowForbidden,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Forbidden => "forbidden",
            Outcome::RateLimited => "rate_limited",
            Outcome::Invalid => "invalid",
            Outcome::NotFound => "not_found",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Blocked => "blocked",
            Outcome::Timeout => "timeout",
            Outcome::ShadowRateLimited => "shadow_rate_limited",
            Outcome::ShadowForbidden => "shadow_forbidden",
        }
    }

    /// The outcome of a request refused with `code`.
    pub fn of(code: Code) -> Self {
        match code {
            Code::Unauthorized => Outcome::Unauthorized,
            Code::PlanRestricted | Code::WrongCredential | Code::NotYourCustomer => {
                Outcome::Forbidden
            }
            Code::UnknownRoute => Outcome::NotFound,
            Code::RateLimited => Outcome::RateLimited,
            Code::TooManyAuthFailures => Outcome::Blocked,
            Code::RequestTimeout => Outcome::Timeout,
            Code::UpstreamUnavailable | Code::UpstreamTimeout => Outcome::UpstreamError,
            Code::InvalidPath
            | Code::InvalidJson
            | Code::InvalidBody
            | Code::BodyTooLarge
            | Code::UnsupportedMediaType
            | Code::HeadersTooLarge
            | Code::BadRequest
            | Code::MethodNotAllowed
            | Code::NotImplemented => Outcome::Invalid,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_is_listed_once_in_discriminant_order() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{o:?}");
        }
        let names: std::collections::HashSet<_> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(names.len(), Outcome::ALL.len());
    }

    #[test]
    fn refusals_map_to_the_contract_outcomes() {
        for code in Code::ALL {
            let want = match code.status() {
                _ if code == Code::TooManyAuthFailures => "blocked",
                408 => "timeout",
                401 => "unauthorized",
                403 => "forbidden",
                404 => "not_found",
                429 => "rate_limited",
                502 | 504 => "upstream_error",
                _ => "invalid",
            };
            assert_eq!(Outcome::of(code).as_str(), want, "{code:?}");
        }
    }
}
