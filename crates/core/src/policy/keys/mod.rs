//! Keys: the digest of each key, the operator's name for it, and the immutable table that
//! finds an entry by digest.
//!
//! Keys are secrets, so the gateway never holds one: the config carries SHA-256 digests, the
//! presented token is hashed ([`mod@super::authenticate`]), and the digest is looked up in an
//! immutable [`KeyTable`] that a reload swaps whole. The table is indexed by a hash of the
//! digest (seeded per table); every comparison of a stored digest with the presented one is of
//! all 32 bytes, in constant time ([`subtle`]).
//!
//! Each entry owns its rate-limit state (an `Arc`, so a reload can hand the same state to the
//! new table for a key that remains: a request still deciding on the old table spends from the
//! same budget as one on the new table). Which store decides on that state is the policy's
//! ([`crate::limit::Store`]).
//!
//! The table is built for up to millions of keys: an entry is 96 bytes with its name inline
//! ([`KeyName`](crate::config::keyname::KeyName); the size is asserted), plus the rate
//! state's allocation (an `Arc` of 24 bytes, 40 in all), and the index is a
//! [`hashbrown::HashTable`] of `u32` positions (a control byte and a position per bucket, at
//! most 7/8 full): about 145 bytes of heap per key in all
//! (docs/benchmarks/history.md). `cargo bench -p tollgate-core --bench keys` measures it
//! (docs/keyscale.md).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | these docs, and the names of the files below, re-exported |
//! | `credential.rs` | who a key belongs to ([`Credential`]), its state ([`KeyState`]), why a token is refused ([`KeyRefusal`]) |
//! | `flags.rs` | what changes while a key serves, in one word ([`KeyFlags`], [`EXPIRED`], [`SUSPENDED`], [`REVOKED`]); the keys in each state, counted as the flags change |
//! | `entry.rs` | one key ([`KeyEntry`]), a `previous` digest ([`Alias`]), what a digest names ([`Found`], [`KeyIdx`]) |
//! | `table.rs` | the [`KeyTable`]: built per config, its digest index, the rate state carried over a reload |
//! | `digests.rs` | which issued key a digest authenticates as: its own digest through the index, a rotation's in a map (`Digests`) |
//! | `index.rs` | the issued keys' own digests → their slots, lock-free, 8 bytes a word (`DigestIndex`) |
//! | `names.rs` | the issued keys' names in order, as slot numbers (`Names`) |
//! | [`issued`] | the keys issued through the admin API, a segment of the table that changes one key at a time ([`Issued`]) |
//! | `tests.rs` | lookups by the full digest, at scale, and the carry-over |

mod credential;
mod digests;
mod entry;
mod flags;
mod index;
pub mod issued;
mod names;
mod table;
#[cfg(test)]
mod tests;

pub use crate::digest::Digest;
pub use credential::{Credential, KeyRefusal, KeyState};
pub use entry::{Alias, Found, KeyEntry, KeyIdx};
pub use flags::{KeyFlags, EXPIRED, REVOKED, SUSPENDED};
pub use issued::{Issued, NewIssued};
pub use table::KeyTable;
