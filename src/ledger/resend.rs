//! Counts sent again add nothing. Every call that adds counts (`report.lua`,
//! `reserve.lua`, and the ledger's `day.lua`) carries a number, rising with each call this
//! process sends, and the script keeps the highest it applied in this replica's own field of
//! the hash (`~<replica id>#`): a call whose number is not above it was applied already and
//! adds nothing. A call whose answer did not come, or that no replica confirmed behind
//! Sentinel or on a Redis Cluster (`WAIT`), is sent again as it was, ahead of anything newer,
//! until a round is confirmed (a confirmed round confirms every write before it on the
//! connection): a master that applied it and failed over before a replica had it gets it
//! back, one that kept it adds nothing. New counts go on while at most
//! [`UNCONFIRMED_ROUNDS`] rounds wait to be confirmed, and then wait on their meters (the
//! calls held are bounded; nothing is counted twice, nothing is dropped).
//!
//! Here: a round's commands with what each answer is for ([`Sent`]), as laid out ([`Laid`]),
//! and the calls that wait to be confirmed ([`Resend`]).

use redis::Cmd;

/// One command of a round, and what its answer is for.
#[derive(Clone)]
pub(super) enum Sent {
    /// Period `id`'s quota counts of the meters `at`, as they stood (`count`): answered by
    /// the fleet's counts, in order.
    Report { id: u32, entries: Vec<(usize, u64)> },
    /// The same, with a reservation: answered by the count and the requests granted.
    Reserve { at: usize, id: u32, count: u64 },
    /// The mark of period `id`'s hash: 1 when it was missing.
    Mark { id: u32 },
    /// Period `id`'s expiry.
    Expire { id: u32 },
    /// Period `id`'s counts put back: the meters and the counts sent.
    Restore { id: u32, entries: Vec<(usize, u64)> },
    /// One `day.lua` call: a day's ledger counts.
    Day,
    /// A call that adds counts sent again whose first answer was read: its answer is not.
    Again,
}

impl Sent {
    /// Whether the command adds counts (and is sent again until a replica confirms it).
    pub(super) fn counts(&self) -> bool {
        matches!(
            self,
            Sent::Report { .. } | Sent::Reserve { .. } | Sent::Day | Sent::Again
        )
    }
}

/// Rounds whose counts may wait for a replica's confirmation before new counts wait too.
pub(super) const UNCONFIRMED_ROUNDS: u32 = 3;

/// The calls that add counts and wait to be confirmed, and for how many rounds.
#[derive(Default)]
pub(super) struct Resend {
    /// The calls that add counts not yet confirmed, in the order sent: sent again, first,
    /// with every round until one is confirmed.
    pub(super) pending: Vec<(Cmd, Sent)>,
    /// Rounds in a row that laid new counts and were not confirmed (or had one fail).
    pub(super) unconfirmed: u32,
}

impl Resend {
    /// Whether new counts wait on their meters: too many rounds wait to be confirmed.
    pub(super) fn held_back(&self) -> bool {
        self.unconfirmed >= UNCONFIRMED_ROUNDS
    }

    /// A round's calls that add counts were answered (`answers`, in order, where they
    /// came) and confirmed or not: what is sent again. Confirmed, a call is done unless its
    /// own answer failed; unconfirmed, every call is sent again, and one answered here
    /// (applied by the master) is [`Sent::Again`], its answer no longer read.
    pub(super) fn settle(
        &mut self,
        calls: Vec<(Cmd, Sent)>,
        answers: Option<Vec<bool>>,
        confirmed: bool,
        added: bool,
    ) {
        let answered = answers.unwrap_or_else(|| vec![false; calls.len()]);
        self.pending = calls
            .into_iter()
            .zip(answered)
            .filter(|((_, s), ok)| !(confirmed && (*ok || matches!(s, Sent::Again))))
            .map(|((c, s), ok)| (c, if ok { Sent::Again } else { s }))
            .collect();
        if confirmed && self.pending.is_empty() {
            self.unconfirmed = 0;
        } else if added {
            self.unconfirmed += 1;
        }
    }
}

/// A round's commands as laid out, in order, each with what its answer is for; and the calls
/// among them that add counts, as each is sent again if unconfirmed.
#[derive(Default)]
pub(super) struct Laid {
    pub(super) cmds: Vec<Cmd>,
    pub(super) sent: Vec<Sent>,
    pub(super) again: Vec<(Cmd, Sent)>,
}

impl Laid {
    /// A round that begins with the calls waiting to be confirmed, sent again as they were.
    pub(super) fn resending(pending: &[(Cmd, Sent)]) -> Self {
        Self {
            cmds: pending.iter().map(|(c, _)| c.clone()).collect(),
            sent: pending.iter().map(|(_, s)| s.clone()).collect(),
            again: pending.to_vec(),
        }
    }

    /// A call that adds counts, answered for `s`, and `twin` sent in its place if unconfirmed.
    pub(super) fn adding(&mut self, c: Cmd, s: Sent, twin: Cmd) {
        self.again.push((twin, s.clone()));
        self.push(c, s);
    }

    /// Any command, answered for `s`.
    pub(super) fn push(&mut self, c: Cmd, s: Sent) {
        self.cmds.push(c);
        self.sent.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(r: &Resend) -> Vec<&'static str> {
        r.pending
            .iter()
            .map(|(_, s)| match s {
                Sent::Report { .. } => "report",
                Sent::Reserve { .. } => "reserve",
                Sent::Day => "day",
                Sent::Again => "again",
                _ => "other",
            })
            .collect()
    }

    #[test]
    fn calls_wait_to_be_confirmed_and_new_counts_wait_after_three_rounds() {
        let calls = || {
            vec![
                (
                    redis::cmd("A"),
                    Sent::Report {
                        id: 1,
                        entries: vec![(0, 1)],
                    },
                ),
                (redis::cmd("B"), Sent::Day),
            ]
        };
        let mut r = Resend::default();
        // No answer: sent again as they were, their answers still to be read.
        r.settle(calls(), None, false, true);
        assert_eq!(pending(&r), ["report", "day"]);
        assert!(!r.held_back());
        // Answered, unconfirmed: sent again, their answers read already; one that failed is
        // still to be read.
        let mut both = r.pending.clone();
        both.extend(calls());
        r.settle(both, Some(vec![true, true, false, true]), false, true);
        assert_eq!(pending(&r), ["again", "again", "report", "again"]);
        assert!(!r.held_back());
        let held = r.pending.clone();
        r.settle(held, Some(vec![true; 4]), false, true);
        assert!(r.held_back(), "three rounds unconfirmed: new counts wait");
        // Rounds that only send again do not count further.
        let held = r.pending.clone();
        r.settle(held, None, false, false);
        assert_eq!(r.unconfirmed, 3);
        // Confirmed: done, but for a call whose own answer failed (not one sent again).
        let mut held = r.pending.clone();
        held.extend(calls());
        r.settle(
            held,
            Some(vec![false, true, true, true, false, true]),
            true,
            false,
        );
        assert_eq!(pending(&r), ["report"]);
        assert!(r.held_back(), "not every call of the round was applied");
        let held = r.pending.clone();
        r.settle(held, Some(vec![true]), true, false);
        assert!(r.pending.is_empty());
        assert!(!r.held_back());
    }
}
