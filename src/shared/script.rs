//! The shared budgets' two scripts (`budget.lua`, `heartbeat.lua`) and how their arguments
//! and answers are packed.
//!
//! **The budget script**, for one key or a batch of keys (`KEYS[1..n]`, one slot each on a
//! Redis Cluster, so a cluster gets one key per call): `ARGV[1]` the replica id, `ARGV[2]` the
//! key horizon (ms), `ARGV[3]` recent (ms), `ARGV[4]` for each key in order its hits, interval
//! (µs) and floor (µs), packed as little-endian 64-bit integers ([`pack_calls`]). Fields: `t`
//! the TAT; per replica `r<id>` "when:hits" of its last report. Answers, for each key in
//! order, `tat − now`, the replicas within the horizon and the hits the others reported within
//! recent, packed the same way: one string of 3n integers ([`unpack_answers`]). One `TIME` for
//! the batch; per key one `HGETALL` (read before writing: this replica's old report is
//! replaced, so it counts as one), one `HSET`, one `PEXPIRE`, and an `HDEL` for each replica
//! gone past the horizon. Packed arguments and answers are one string each way instead of three
//! numbers per key: Redis makes no object per number, and the gateway parses one reply per
//! batch (docs/benchmarks.md, tuning step 13). Mirrors
//! `tollgate_core::limit::shared::model::Model::budget`.
//!
//! **The heartbeat script**: `KEYS[1]` the fleet; `ARGV`: replica id, fleet horizon (ms);
//! answers how many replicas are alive. Mirrors `Model::heartbeat`.

use crate::limit::shared::Call;

/// The budget script's source.
pub const BUDGET_LUA: &str = include_str!("budget.lua");

/// The heartbeat script's source.
pub const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");

/// The budget script's `ARGV[4]` for `calls`: hits, interval (µs) and floor (µs) of each, as
/// little-endian 64-bit integers.
pub fn pack_calls<'c>(calls: impl IntoIterator<Item = &'c Call>) -> Vec<u8> {
    let calls = calls.into_iter();
    let mut v = Vec::with_capacity(24 * calls.size_hint().0);
    for c in calls {
        v.extend_from_slice(&c.hits.to_le_bytes());
        v.extend_from_slice(&c.interval_us.to_le_bytes());
        v.extend_from_slice(&c.floor_us.to_le_bytes());
    }
    v
}

/// The budget script's answer for `n` keys: per key `(ahead µs, replicas, others' recent
/// hits)`, or `None` when it is not 3n packed integers.
pub fn unpack_answers(packed: &[u8], n: usize) -> Option<Vec<(u64, u32, u64)>> {
    if packed.len() != 24 * n {
        return None;
    }
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    Some(
        packed
            .chunks_exact(24)
            .map(|r| {
                let replicas = u32::try_from(word(&r[8..16])).unwrap_or(u32::MAX);
                (word(&r[..8]), replicas, word(&r[16..]))
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
                hits: 3,
                interval_us: 66_667,
                floor_us: 0,
            },
            Call {
                id: Digest([2; 32]),
                hits: 0,
                interval_us: 1,
                floor_us: u64::MAX,
            },
        ];
        let packed = pack_calls(&calls);
        assert_eq!(packed.len(), 48);
        assert_eq!(&packed[..8], &3u64.to_le_bytes());
        assert_eq!(&packed[8..16], &66_667u64.to_le_bytes());
        assert_eq!(&packed[40..], &u64::MAX.to_le_bytes());
        // An answer is read the same way: (ahead, replicas, others) per key.
        let answer: Vec<u8> = [7u64, 2, 5, 1 << 40, 1, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(
            unpack_answers(&answer, 2),
            Some(vec![(7, 2, 5), (1 << 40, 1, 0)])
        );
        // Anything but 24 bytes a key is no answer: a short, long or empty reply.
        assert_eq!(unpack_answers(&answer, 1), None);
        assert_eq!(unpack_answers(&answer[..47], 2), None);
        assert_eq!(unpack_answers(&[], 1), None);
        assert_eq!(unpack_answers(&[], 0), Some(vec![]));
        // A replica count past u32 (no store sends one) is held at u32::MAX, not wrapped.
        let huge: Vec<u8> = [0u64, u64::MAX, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(unpack_answers(&huge, 1), Some(vec![(0, u32::MAX, 0)]));
    }
}
