//! The ledger's columns: where a request of a key is counted. [`Column::ALL`] is the one list
//! of them: a meter's count indexes, the names the keeper writes, and the ledger's header
//! and CSV columns all derive from it.

use crate::refusal::Code;

/// A ledger column: where a request of a key is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    /// Forwarded; the upstream answered 1xx, 2xx or 3xx.
    Upstream2xx,
    /// Forwarded; the upstream answered 4xx.
    Upstream4xx,
    /// Forwarded; the upstream answered 5xx.
    Upstream5xx,
    /// Forwarded (or admitted to be) and no answer came: 502, 504, or the client left.
    UpstreamFailed,
    /// Refused with this code.
    Refused(Code),
}

/// Counts per day: the four upstream columns, then one per code ([`Code::ALL`]'s order).
pub const COLUMNS: usize = 4 + Code::ALL.len();

impl Column {
    /// Every column, in the order of a meter's counts: the four upstream ones, then one per
    /// refusal code in [`Code::ALL`]'s order.
    pub const ALL: [Column; COLUMNS] = {
        let mut all = [Column::Upstream2xx; COLUMNS];
        all[1] = Column::Upstream4xx;
        all[2] = Column::Upstream5xx;
        all[3] = Column::UpstreamFailed;
        let mut i = 0;
        while i < Code::ALL.len() {
            all[4 + i] = Column::Refused(Code::ALL[i]);
            i += 1;
        }
        all
    };

    /// The column's name in the ledger (`upstream_2xx`, or the refusal's code).
    pub fn name(self) -> &'static str {
        match self {
            Column::Upstream2xx => "upstream_2xx",
            Column::Upstream4xx => "upstream_4xx",
            Column::Upstream5xx => "upstream_5xx",
            Column::UpstreamFailed => "upstream_failed",
            Column::Refused(c) => c.as_str(),
        }
    }

    /// Whether it counts forwarded requests (`forwarded` is the sum of these).
    pub fn is_upstream(self) -> bool {
        !matches!(self, Column::Refused(_))
    }

    /// Whether the ledger shows it ([`Column::shown`] for a refusal's).
    pub fn is_shown(self) -> bool {
        match self {
            Column::Refused(c) => Column::shown(c),
            _ => true,
        }
    }

    /// The column of a forwarded request the upstream answered with `status` (0: none).
    pub fn upstream(status: u16) -> Self {
        match status {
            100..=399 => Column::Upstream2xx,
            400..=499 => Column::Upstream4xx,
            500..=599 => Column::Upstream5xx,
            _ => Column::UpstreamFailed,
        }
    }

    /// Its place in [`Column::ALL`] (and in a meter's counts).
    pub(super) fn index(self) -> usize {
        match self {
            Column::Upstream2xx => 0,
            Column::Upstream4xx => 1,
            Column::Upstream5xx => 2,
            Column::UpstreamFailed => 3,
            Column::Refused(c) => 4 + c as usize,
        }
    }

    /// Whether the ledger shows a column for `code`: every refusal code but `unauthorized`
    /// and `too_many_streams` (decided before any key is read: never a key's), and not
    /// `upstream_unavailable` and `upstream_timeout`, which are forwarded requests that
    /// failed (`upstream_failed`).
    pub fn shown(code: Code) -> bool {
        !matches!(
            code,
            Code::Unauthorized
                | Code::TooManyStreams
                | Code::UpstreamUnavailable
                | Code::UpstreamTimeout
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_column_sits_at_its_index_under_a_name_of_its_own() {
        let mut names = std::collections::HashSet::new();
        for (i, c) in Column::ALL.iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
            assert!(names.insert(c.name()), "{} twice", c.name());
        }
        assert_eq!(
            Column::ALL.iter().filter(|c| c.is_upstream()).count(),
            4,
            "forwarded is the sum of four"
        );
        assert!(!Column::Refused(Code::Unauthorized).is_shown());
    }
}
