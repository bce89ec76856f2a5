//! `GET /api/blocks` and `DELETE /api/blocks/{address}`: the addresses that auth-failure
//! blocking holds now, and an operator's release of one.
//!
//! Two tables block addresses: the gateway's (`auth_failures`: wrong API keys, 429
//! `too_many_auth_failures` on the gateway's listener) and the admin listener's own (wrong
//! admin tokens, [`super::guard::TOKEN_FAILURES`]). Both are listed, each row saying which
//! `listener` it holds; a release frees the address from both, so an operator locked out of
//! the admin listener at one address can free it from another. A release also forgets the
//! address's failures: its next wrong key is its first. Blocks are in memory, per process:
//! they outlive a reload (a reload is not a way to clear them), not a restart.

use crate::clock::{rfc3339, Nanos};
use crate::policy::blocking::{Block, FailureTable};
use crate::policy::client::ClientKey;

use http::Response;

use super::codes::AdminCode;
use super::reply::{no_content, problem};
use super::view::BlockRow;
use super::Admin;

/// The blocks in force at `now` (the tables' clock), longest-held first; `now_ms` is the same
/// instant in ms since the Unix epoch, to date them.
pub(crate) fn rows(
    gateway: &FailureTable,
    admin: &FailureTable,
    now: Nanos,
    now_ms: u64,
) -> Vec<BlockRow> {
    let at = |t: Nanos| {
        let ago_ms = now.saturating_sub(t) / 1_000_000;
        let ahead_ms = t.saturating_sub(now) / 1_000_000;
        rfc3339((now_ms + ahead_ms).saturating_sub(ago_ms))
    };
    let row = |b: Block, listener: &str| BlockRow {
        address: b.key.display(),
        since: at(b.since),
        until: at(b.until),
        failures: b.failures,
        listener: listener.to_string(),
    };
    let mut v: Vec<(Nanos, BlockRow)> = gateway
        .blocks(now)
        .into_iter()
        .map(|b| (b.since, row(b, "gateway")))
        .chain(
            admin
                .blocks(now)
                .into_iter()
                .map(|b| (b.since, row(b, "admin"))),
        )
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.address.cmp(&b.1.address)));
    v.into_iter().map(|(_, r)| r).collect()
}

/// What a release found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Freed from these listeners' tables.
    Freed(ClientKey, Vec<&'static str>),
    /// Held by neither.
    NotBlocked(ClientKey),
    /// Not an address.
    NotAnAddress,
}

/// Release `address` (as a row shows it, or any address a /64 row covers) from both tables.
pub(crate) fn release(
    gateway: &FailureTable,
    admin: &FailureTable,
    address: &str,
    now: Nanos,
) -> Released {
    let Some(key) = ClientKey::parse(address) else {
        return Released::NotAnAddress;
    };
    let freed: Vec<&'static str> = [(gateway, "gateway"), (admin, "admin")]
        .into_iter()
        .filter(|(t, _)| t.release(key, now))
        .map(|(_, name)| name)
        .collect();
    if freed.is_empty() {
        Released::NotBlocked(key)
    } else {
        Released::Freed(key, freed)
    }
}

impl Admin {
    /// The blocks in force now, on both listeners.
    pub(super) fn blocks(&self) -> Vec<BlockRow> {
        let snap = self.live.load();
        let now_ms = self.live.usage().now_ms();
        rows(
            &snap.policy.failures,
            &self.failures,
            self.clock.now(),
            now_ms,
        )
    }

    /// `DELETE /api/blocks/{address}` (`address` percent-decoded): the address served again
    /// at once.
    pub(super) fn release_block(&self, address: &str) -> Response<Vec<u8>> {
        let snap = self.live.load();
        let gateway = &snap.policy.failures;
        match release(gateway, &self.failures, address, self.clock.now()) {
            Released::Freed(key, listeners) => {
                self.live
                    .metrics()
                    .set_auth_blocked_ips(gateway.blocked_count());
                tracing::info!(
                    target: "tollgate::admin",
                    client = %key.display(),
                    listeners = %listeners.join(","),
                    "auth-failure block released by an operator"
                );
                no_content()
            }
            Released::NotBlocked(key) => problem(AdminCode::NotBlocked, &format!("`{}` is not blocked now", key.display()),
            ),
            // Nothing that is not an address is ever blocked: the same 404, saying why.
            Released::NotAnAddress => problem(AdminCode::NotBlocked, "not an address: name an IPv4 or IPv6 address, or an IPv6 /64 as `GET /api/blocks` shows it",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AuthFailures;
    use std::num::{NonZeroU32, NonZeroUsize};
    use std::time::Duration;

    const SEC: Nanos = 1_000_000_000;

    fn block(t: &FailureTable, addr: &str, at: Nanos) {
        let p = AuthFailures {
            max_failures: NonZeroU32::new(2).unwrap(),
            window: Duration::from_secs(60),
            block: Duration::from_secs(300),
            max_tracked_ips: NonZeroUsize::new(100).unwrap(),
        };
        let key = ClientKey::parse(addr).unwrap();
        t.failed(key, at, &p);
        t.failed(key, at, &p);
        assert!(t.blocked(key, at).is_some());
    }

    #[test]
    fn rows_are_dated_from_the_wall_clock_and_name_their_listener() {
        let (gw, adm) = (FailureTable::new(), FailureTable::new());
        block(&gw, "192.0.2.7", 100 * SEC);
        block(&adm, "2001:db8:1:2::9", 40 * SEC);
        // 130 s on the tables' clock is 2026-11-25T19:40:00Z.
        let rows = rows(&gw, &adm, 130 * SEC, 1_795_635_600_000);
        let got: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.address.as_str(),
                    r.since.as_str(),
                    r.until.as_str(),
                    r.failures,
                    r.listener.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    "2001:db8:1:2::/64",
                    "2026-11-25T19:38:30Z",
                    "2026-11-25T19:43:30Z",
                    2,
                    "admin"
                ),
                (
                    "192.0.2.7",
                    "2026-11-25T19:39:30Z",
                    "2026-11-25T19:44:30Z",
                    2,
                    "gateway"
                ),
            ]
        );
    }

    #[test]
    fn a_release_frees_the_address_from_both_listeners_once() {
        let (gw, adm) = (FailureTable::new(), FailureTable::new());
        block(&gw, "192.0.2.7", SEC);
        block(&adm, "192.0.2.7", SEC);
        let key = ClientKey::parse("192.0.2.7").unwrap();
        assert_eq!(
            release(&gw, &adm, "192.0.2.7", 2 * SEC),
            Released::Freed(key, vec!["gateway", "admin"])
        );
        assert_eq!(gw.blocked(key, 2 * SEC), None);
        assert_eq!(adm.blocked(key, 2 * SEC), None);
        assert_eq!(
            release(&gw, &adm, "192.0.2.7", 2 * SEC),
            Released::NotBlocked(key)
        );
        assert_eq!(
            release(&gw, &adm, "not-an-address", 2 * SEC),
            Released::NotAnAddress
        );
    }
}
