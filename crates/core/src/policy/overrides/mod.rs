//! Partner upgrades applied at the edge: plan overrides.
//!
//! When the upstream accepts a partner's `POST /v2/service/upgrade`, the customer key whose
//! digest is the body's `apiKey` moves to the plan whose `plan_id` is `planID`
//! ([`Policy::apply_upgrade`](super::Policy::apply_upgrade)): one atomic store in the key's
//! entry, so the very next request is decided on the new plan's allow-list and limit. The
//! budget carries over as on a reload: the limiter's state is time, so the share of the window
//! already used is kept.
//!
//! A [`KeyRecord`] is what is kept (on disk or in Redis, by the runtime) so that it outlives
//! the process: the plan given, and the plan the YAML gave the key at the time. The YAML stays
//! the operator's: when a config is compiled
//! ([`Policy::apply_overrides`](super::Policy::apply_overrides)) an override whose key is gone,
//! whose plan is gone, or whose key the YAML has since put on another plan is dropped (the
//! later decision wins), and each drop is reported to be logged and forgotten.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | these docs, and the names of the files below, re-exported |
//! | `record.rs` | what is kept: [`KeyRecord`] and its parts ([`Change`], [`LimitChange`], [`QuotaChange`]) |
//! | `records.rs` | every record in force by digest ([`KeyRecords`]), a plain issued key's held in a few words |
//! | `part.rs` | every part of a record, one row each ([`Part`]): its field's suffix and its word |
//! | `action.rs` | what is asked and what comes of it: [`Upgrade`], [`Pending`], [`Action`], [`ChangeRefused`], [`Dropped`], [`Drop`] |
//! | `issue.rs` | keys issued through the admin API: a new key, a rotation, a deletion as records ([`NewKey`], `Policy::issue`, `rotate`, `delete`), a kept key put in the table |
//! | `kind.rs` | every kind of change, one row each ([`ChangeKind`]): the metric's and the log's `action` |
//! | `apply.rs` | how changes are applied to the key table: `impl Policy` (`plan_by_id`, `upgrade`, `apply_upgrade`, `fingerprint`, `apply_overrides`, `apply_record`, `change`, `overrides_in_force`) |
//! | `tests.rs` | upgrades applied, carried over a reload, and dropped by a new config |

mod action;
mod apply;
mod issue;
#[cfg(test)]
mod issue_tests;
mod kind;
mod part;
mod record;
mod records;
#[cfg(test)]
mod tests;

pub use action::{Action, ChangeRefused, Drop, Dropped, Pending, Upgrade};
pub use apply::Applying;
pub use issue::{check_issued, NewKey};
pub use kind::ChangeKind;
pub use part::Part;
pub use record::{Change, IssuedKey, KeyRecord, LimitChange, PreviousDigest, QuotaChange};
pub use records::{Compact, HeldRecord, IssuedView, KeyRecords, PlainIssued};
