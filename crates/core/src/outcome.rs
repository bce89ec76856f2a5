//! How a request ended: the `outcome` label of `tollgate_requests_total` and the access log.

/// One row per outcome: the variant and its name (the `outcome` label); [`Outcome::ALL`] and
/// [`Outcome::as_str`] are derived from the rows.
macro_rules! outcomes {
    ($($(#[$doc:meta])* $outcome:ident => $name:literal;)*) => {
        /// How a request ended, for logs and metrics.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub enum Outcome {
            #[default]
            $($(#[$doc])* $outcome,)*
        }

        impl Outcome {
            /// Every outcome, in discriminant order.
            pub const ALL: &'static [Outcome] = &[$(Outcome::$outcome),*];

            /// The outcome's name: the `outcome` label.
            pub fn as_str(self) -> &'static str {
                match self { $(Outcome::$outcome => $name,)* }
            }
        }
    };
}

outcomes! {
    /// Admitted and forwarded to the upstream.
    Forwarded => "forwarded";
    /// Refused `401 unauthorized`.
    Unauthorized => "unauthorized";
    /// Refused with a 403 (`plan_restricted`, `wrong_credential`, `not_your_customer`).
    Forbidden => "forbidden";
    /// Refused `429 rate_limited`.
    RateLimited => "rate_limited";
    /// Refused as a malformed request: a 400, 405, 413, 415, 431 or 501.
    Invalid => "invalid";
    /// Refused `404 unknown_route`.
    NotFound => "not_found";
    /// The upstream could not be reached or did not answer in time (502, 504).
    UpstreamError => "upstream_error";
    /// Refused because the client address is blocked (failed authentications).
    Blocked => "blocked";
    /// A deadline of the edge ended the request (a checked body too slow to arrive).
    Timeout => "timeout";
    /// Forwarded, though the plan's limit would have refused it (the plan is in shadow mode).
    ShadowRateLimited => "shadow_rate_limited";
    /// Forwarded, though the plan's allow-list would have refused it (shadow mode).
    ShadowForbidden => "shadow_forbidden";
    /// Refused `429 quota_exhausted`: over the key's quota for its period.
    QuotaExhausted => "quota_exhausted";
    /// Forwarded, though the plan's quota would have refused it (shadow mode).
    ShadowQuotaExhausted => "shadow_quota_exhausted";
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
}
