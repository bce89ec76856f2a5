//! The shared budgets' two scripts (`budget.lua`, `heartbeat.lua`) and how their arguments
//! and answers are packed.
//!
//! **The budget script**, for one key or a batch of keys (`KEYS[1..n]`, one slot each on a
//! Redis Cluster, so a cluster gets one key per call): `ARGV[1]` the key horizon (ms),
//! `ARGV[2]` for each key in order its want, give, debt, interval (µs), limit, floor (µs) and
//! early (µs), packed as little-endian 64-bit integers ([`pack_calls`]). The hash's one field
//! `t` is the TAT (µs of Redis's clock). Per key: `tat = max(tat, now, now + floor) + debt ×
//! T`, then `tat = max(now, tat − give × T)`, `granted = min(want, ⌊(now + early + L·T − tat)
//! / T⌋)`,
//! `tat += granted × T`; it answers `granted` and `tat − now`, packed the same way: one string
//! of 2n integers ([`unpack_answers`]). One `TIME` for the batch; per key one `HGET`, one
//! `HSET`, one `PEXPIRE` (the TAT plus the horizon). Packed arguments and answers are one
//! string each way instead of numbers per key: Redis makes no object per number, and the
//! gateway parses one reply per batch (docs/benchmarks/history.md, tuning step 13). Mirrors
//! `tollgate_core::limit::shared::model::Model::budget`.
//!
//! **The heartbeat script**: `KEYS[1]` the fleet; `ARGV`: replica id, fleet horizon (ms);
//! answers how many replicas are alive. Mirrors `Model::heartbeat`.

use crate::limit::shared::{Call, Reply};

/// The budget script's source.
pub const BUDGET_LUA: &str = include_str!("budget.lua");

/// The heartbeat script's source.
pub const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");

/// The budget script's `ARGV[2]` for `calls`: want, give, debt, interval (µs), limit, floor
/// (µs) and early (µs) of each, as little-endian 64-bit integers.
pub fn pack_calls<'c>(calls: impl IntoIterator<Item = &'c Call>) -> Vec<u8> {
    let calls = calls.into_iter();
    let mut v = Vec::with_capacity(56 * calls.size_hint().0);
    for c in calls {
        let words = [
            c.want,
            c.give,
            c.debt,
            c.interval_us,
            c.limit,
            c.floor_us,
            c.early_us,
        ];
        for w in words {
            v.extend_from_slice(&w.to_le_bytes());
        }
    }
    v
}

/// The budget script's answer for `n` keys: per key `(granted, ahead µs)`, or `None` when it
/// is not 2n packed integers.
pub fn unpack_answers(packed: &[u8], n: usize) -> Option<Vec<Reply>> {
    if packed.len() != 16 * n {
        return None;
    }
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    Some(
        packed
            .chunks_exact(16)
            .map(|r| Reply {
                granted: word(&r[..8]),
                ahead_us: word(&r[8..]),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;

    #[test]
    fn calls_and_answers_pack_as_little_endian_words() {
        let calls = [
            Call {
                id: Digest([1; 32]),
                want: 3,
                give: 0,
                debt: 2,
                interval_us: 66_667,
                limit: 150,
                floor_us: 0,
                early_us: 0,
            },
            Call {
                id: Digest([2; 32]),
                want: 0,
                give: 1,
                debt: 0,
                interval_us: 1,
                limit: 1,
                floor_us: u64::MAX,
                early_us: 100_000,
            },
        ];
        let packed = pack_calls(&calls);
        assert_eq!(packed.len(), 112);
        assert_eq!(&packed[..8], &3u64.to_le_bytes());
        assert_eq!(&packed[16..24], &2u64.to_le_bytes());
        assert_eq!(&packed[24..32], &66_667u64.to_le_bytes());
        assert_eq!(&packed[32..40], &150u64.to_le_bytes());
        assert_eq!(&packed[48..56], &0u64.to_le_bytes());
        assert_eq!(&packed[64..72], &1u64.to_le_bytes());
        assert_eq!(&packed[96..104], &u64::MAX.to_le_bytes());
        assert_eq!(&packed[104..], &100_000u64.to_le_bytes());
        // An answer is read the same way: (granted, ahead) per key.
        let answer: Vec<u8> = [7u64, 2, 0, 1 << 40]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let r = |granted, ahead_us| Reply { granted, ahead_us };
        assert_eq!(
            unpack_answers(&answer, 2),
            Some(vec![r(7, 2), r(0, 1 << 40)])
        );
        // Anything but 16 bytes a key is no answer: a short, long or empty reply.
        assert_eq!(unpack_answers(&answer, 1), None);
        assert_eq!(unpack_answers(&answer[..31], 2), None);
        assert_eq!(unpack_answers(&[], 1), None);
        assert_eq!(unpack_answers(&[], 0), Some(vec![]));
    }
}
