//! With `cluster`: the set read whole, turned into the records in force. A whole read hands
//! its pages as they come ([`gather_beside`]) to a blocking thread that parses each field
//! while the next page is read, so a start at a million issued keys reads and parses at once
//! instead of one after the other; the parts gathered are then merged by digest and matched
//! to the keys' digests ([`Parts::into_set`]). A start with the copy at `state.path` gathers
//! that copy's pages the same way ([`gather_unheld`], from `fleet.rs`), each parsed once from
//! its text.
//!
//! An issued key's records are gathered under their digests in one vector sized once, each
//! in the form the set holds it ([`Compact`]: a plain issued key's in a few words), and
//! sorted where they lie: each buffer of a million whole records (some 500 bytes each, with
//! what they box) is fresh memory the kernel zeroes first, which on a virtual machine costs
//! more than the records' parse (docs/keyscale.md, "A start from Redis").

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::redis_set::{compact, field, split_field, Pages};
use crate::digest::Digest;
use crate::policy::overrides::{Compact, KeyRecord, KeyRecords, Part};
use crate::policy::versions::{part_of_field, Fields, Kept, Version};
use crate::policy::Policy;

/// Pages a whole read may hold ready before the parse takes them.
const PAGES_AHEAD: usize = 4;

/// Chunks of the compact copy read ahead of the two threads that parse them (some 1.1 MB
/// each).
const CHUNKS_AHEAD: usize = 4;

/// The set read whole, as it came: the copy's fields and the records' parts.
pub(super) struct Gathered {
    /// Every field that names a part, its text packed as the copy holds it, in the order
    /// read (none from [`gather_unheld`]: the copy at `state.path`, which holds them).
    pub(super) fields: Vec<(String, Kept)>,
    /// Of `fields`, each issued key's own part (the field of the digest its record names):
    /// its place in `fields`, and that digest. Gathered for a copy held in memory
    /// ([`gather_beside`], [`gather_chunks`], [`gather_page`]), such a field is held with an
    /// empty name, made again from the digest where needed. The copy need not hold such a field's text
    /// while the set in force can make it again ([`super::fleet`]). Empty when not asked for.
    pub(super) issued: Vec<(usize, Digest)>,
    pub(super) parts: Parts,
    /// How many fields name a part.
    pub(super) count: usize,
    /// The latest version of those fields (0 for none): the clock is moved past it.
    pub(super) latest: Version,
}

/// A sender for a whole read's pages, and the thread that gathers them: it ends, and its
/// handle answers, once the sender is dropped. `about` is how many fields the set holds;
/// `issued`: whether to name the issued keys' own parts ([`Gathered::issued`]: a copy held in
/// memory needs them, one at `state.path` does not).
pub(super) fn gather_beside(
    about: usize,
    issued: bool,
) -> (Pages, tokio::task::JoinHandle<Gathered>) {
    let (pages, mut rx) = mpsc::channel::<Vec<(String, String)>>(PAGES_AHEAD);
    let gathering = tokio::task::spawn_blocking(move || {
        let pages = std::iter::from_fn(|| rx.blocking_recv());
        gather_with(pages, about, true, issued, issued)
    });
    (pages, gathering)
}

/// The gathering of the compact copy's chunks: what they held, how many entries, and how
/// many of those were left out as read again.
pub(super) type GatheringChunks = tokio::task::JoinHandle<Option<(Gathered, u64, u64)>>;

/// A sender for the chunks of the set's compact copy (`redis_set::compact`), and the two
/// threads that gather them as [`gather_beside`] gathers pages, each taking the next chunk
/// as it is free (each with its place in the copy of `generation`, which its first entry
/// must name): each chunk decoded, and its fields but those in `skip` (read again since
/// the copy was made) gathered, each text parsed where it lies in the chunk. The handle
/// answers both threads' gatherings as one, with how many entries the chunks held and how
/// many of them were in `skip`; or `None`
/// when a chunk was not one, or the chunks held more than `most` entries (the gathering is
/// then to be let go).
pub(super) fn gather_chunks(
    about: usize,
    issued: bool,
    skip: Arc<HashSet<String>>,
    most: u64,
    generation: &str,
) -> (mpsc::Sender<(u32, Vec<u8>)>, GatheringChunks) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let (chunks, rx) = mpsc::channel::<(u32, Vec<u8>)>(CHUNKS_AHEAD);
    let rx = Arc::new(std::sync::Mutex::new(rx));
    let (entries, again) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    // Either thread may take most chunks: each is sized for the whole (only what is filled
    // is resident), and the one that took fewer is merged into the other.
    let threads = [about, about].map(|about| {
        let (rx, skip) = (Arc::clone(&rx), Arc::clone(&skip));
        let (entries, again) = (Arc::clone(&entries), Arc::clone(&again));
        let generation = generation.to_string();
        tokio::task::spawn_blocking(move || {
            let mut g = Gatherer::new(about, true, issued, issued);
            let next = || rx.lock().ok()?.blocking_recv();
            let (mut whole, mut room) = (true, compact::Room::default());
            while let Some((i, chunk)) = next() {
                let mut within = true;
                let at = compact::place(&generation, i);
                whole = compact::read_chunk(&chunk, &mut room, &at, |f, text| {
                    within &= entries.fetch_add(1, Ordering::Relaxed) < most;
                    if within && skip.contains(f) {
                        again.fetch_add(1, Ordering::Relaxed);
                    } else if within {
                        g.add(f.to_string(), text);
                    }
                }) && within;
                if !whole {
                    break;
                }
            }
            whole.then(|| g.done())
        })
    });
    let gathering = tokio::spawn(async move {
        let [a, b] = threads;
        let (a, b) = (a.await.ok().flatten()?, b.await.ok().flatten()?);
        let both = if a.count >= b.count {
            a.merge(b)
        } else {
            b.merge(a)
        };
        let counted = (
            entries.load(Ordering::Relaxed),
            again.load(Ordering::Relaxed),
        );
        Some((both, counted.0, counted.1))
    });
    (chunks, gathering)
}

/// [`gather`] of one page, naming the issued keys' own parts when `issued` (as
/// [`gather_beside`]).
pub(super) fn gather_page(page: Vec<(String, String)>, issued: bool) -> Gathered {
    let about = page.len();
    gather_with([page], about, true, issued, issued)
}

/// Gather `pages` (each field's name and its text as kept, as Redis answers a page and as
/// the copy at `state.path` holds it; about `about` fields in all): each field that names a
/// part, its text packed for the copy ([`held`]), and its record parsed from the text.
pub(super) fn gather(
    pages: impl IntoIterator<Item = Vec<(String, String)>>,
    about: usize,
) -> Gathered {
    gather_with(pages, about, true, true, false)
}

/// [`gather`] of pages whose fields stay where they were read (the copy at `state.path`):
/// each field's record and version read from its text, and no field kept.
pub(super) fn gather_unheld(
    pages: impl IntoIterator<Item = Vec<(String, String)>>,
    about: usize,
) -> Gathered {
    gather_with(pages, about, false, false, false)
}

fn gather_with(
    pages: impl IntoIterator<Item = Vec<(String, String)>>,
    about: usize,
    keep: bool,
    ids: bool,
    unnamed: bool,
) -> Gathered {
    let mut g = Gatherer::new(about, keep, ids, unnamed);
    for page in pages {
        for (f, text) in page {
            g.add(f, &text);
        }
    }
    g.done()
}

/// A gathering under way: [`Gathered`] as its fields come.
struct Gatherer {
    g: Gathered,
    /// Whether to keep each field's text packed ([`Gathered::fields`]).
    keep: bool,
    /// Whether to name the issued keys' own parts ([`Gathered::issued`]).
    ids: bool,
    /// Whether to hold those parts' fields unnamed (an empty name: [`Gathered::fields`]).
    unnamed: bool,
}

impl Gatherer {
    fn new(about: usize, keep: bool, ids: bool, unnamed: bool) -> Self {
        Self {
            g: Gathered {
                fields: Vec::with_capacity(if keep { about } else { 0 }),
                issued: Vec::with_capacity(if ids { about } else { 0 }),
                parts: Parts::with_capacity(about),
                count: 0,
                latest: 0,
            },
            keep,
            ids,
            unnamed: ids && unnamed,
        }
    }

    /// The field `f` with its text as kept: its record parsed, its text packed when kept.
    fn add(&mut self, f: String, text: &str) {
        let Some(version) = part_of_field(&f).and_then(|_| Kept::version_of(text)) else {
            return;
        };
        let g = &mut self.g;
        // Read from the text, before the copy holds it packed.
        let id = g.parts.add_record(&f, Kept::record_of(text));
        g.count += 1;
        g.latest = g.latest.max(version);
        if !self.keep {
            return;
        }
        if let Some(k) = Kept::parse(text) {
            let at = g.fields.len();
            let named = id.filter(|_| self.ids);
            g.issued.extend(named.map(|id| (at, id)));
            // Most such parts the set in force makes again, and the copy holds no text of
            // them: their names are made again from their digests for the few it holds
            // (`fleet::split_made`), and none is made here to be let go there (a million
            // small strings freed among what the start keeps hold its pages resident).
            let own = split_field(&f).is_some_and(|(_, p)| p == Part::Issued);
            let f = if self.unnamed && named.is_some() && own {
                String::new()
            } else {
                f
            };
            g.fields.push((f, k));
        }
    }

    fn done(self) -> Gathered {
        self.g
    }
}

impl Gathered {
    /// `self` and `other`, gathered from two parts of one set (no field in both).
    pub(super) fn merge(mut self, other: Gathered) -> Gathered {
        let at = self.fields.len();
        self.fields.extend(other.fields);
        self.issued
            .extend(other.issued.into_iter().map(|(i, d)| (i + at, d)));
        self.parts.issued.extend(other.parts.issued);
        self.parts.hashes.extend(other.parts.hashes);
        self.parts.other.extend(other.parts.other);
        self.count += other.count;
        self.latest = self.latest.max(other.latest);
        self
    }
}

/// `fields` as the copy holds them in memory: one tree built in one go (sorted, its nodes
/// full; a field read twice keeps the later copy, as an insert would). Made off the path a
/// start waits on where it can be (`sync.rs`): the sort of a million names takes a good part
/// of a second.
pub(super) fn held(fields: Vec<(String, Kept)>) -> Fields {
    Fields::from_iter(fields)
}

/// Each part's record (tombstones left out): an issued key's own part under the digest it
/// names (checked against the field's hash, and most records are of issued keys), any other
/// under the hash of its digest (the field's first 32 hex digits, read as a number).
pub(super) struct Parts {
    /// Each held as the set will hold it, made so as it is parsed: a plain issued key's
    /// record in a few words (some 80 bytes an entry here), not a whole record of some 500
    /// held until the set is built.
    issued: Vec<(Digest, Compact)>,
    /// The hash of each of `issued`'s digests, in the same order.
    hashes: Vec<u128>,
    other: Vec<(u128, KeyRecord)>,
}

impl Parts {
    fn with_capacity(n: usize) -> Self {
        Self {
            issued: Vec::with_capacity(n),
            hashes: Vec::with_capacity(n),
            other: Vec::new(),
        }
    }

    /// Add the part `o` the field `f` holds (`None`: not a record); the digest it is kept
    /// under when it is an issued key's own part.
    fn add_record(&mut self, f: &str, o: Option<KeyRecord>) -> Option<Digest> {
        let (h, hash) = split_field(f).and_then(|(h, _)| Some((h, hash_of(h)?)))?;
        let o = o.filter(|o| !o.is_empty())?;
        match o.issued.as_ref().map(|k| k.id) {
            Some(id) if field(&id) == h => {
                self.issued.push((id, Compact::of(&id, o)));
                self.hashes.push(hash);
                Some(id)
            }
            _ => {
                self.other.push((hash, o));
                None
            }
        }
    }

    /// The records for every issued key (its record names the digest it was issued with) and
    /// for the digests of `policy`'s keys and their `previous` digests, each digest's parts
    /// merged. Fields are hashes of digests and each part names its key: a digest counts when
    /// its key's name is the part's and it hashes to the field. One pass over the keys,
    /// whatever the number of records; only a revocation whose key's name is in no entry any
    /// more (a renamed or removed key) makes every digest be hashed, so that it still finds
    /// its digest.
    pub(super) fn into_set(self, policy: &Policy) -> KeyRecords {
        let Parts {
            mut issued,
            hashes,
            other,
        } = self;
        // Each other part by its hash, merged; then into an issued key's record when it is of
        // one (a suspension of an issued key), else found by its key's name.
        let mut by_hash: HashMap<u128, KeyRecord> = HashMap::new();
        for (h, o) in other {
            by_hash.entry(h).or_default().merge(o);
        }
        if !by_hash.is_empty() {
            for ((d, record), h) in issued.iter_mut().zip(&hashes) {
                if let Some(o) = by_hash.remove(h) {
                    record.merge(d, o);
                }
            }
        }
        drop(hashes);
        let mut by_name: HashMap<&str, Vec<u128>> = HashMap::new();
        for (h, o) in &by_hash {
            by_name.entry(o.key.as_str()).or_default().push(*h);
        }
        let keys = &policy.keys;
        let mut found = Vec::new();
        let digests = keys
            .iter()
            .map(|(k, e)| (k, e.digest))
            .chain(keys.aliases().map(|(_, a)| (a.key, a.digest)));
        for (k, d) in digests {
            let Some(named) = by_name.get(keys.get(k).name.as_str()) else {
                continue;
            };
            let h = hash_of(&field(&d));
            if named.iter().any(|n| Some(*n) == h) {
                found.push((d, h));
            }
        }
        drop(by_name);
        for (d, h) in found {
            if let Some(o) = h.and_then(|h| by_hash.remove(&h)) {
                issued.push((d, Compact::of(&d, o)));
            }
        }
        if by_hash.values().any(|o| o.revoked.is_some()) {
            let every = keys
                .iter()
                .map(|(_, e)| e.digest)
                .chain(keys.aliases().map(|(_, a)| a.digest));
            for d in every {
                if let Some(o) = hash_of(&field(&d)).and_then(|h| by_hash.remove(&h)) {
                    issued.push((d, Compact::of(&d, o)));
                }
            }
        }
        // Sorted where they lie, so the tree is built from them without another buffer of a
        // million records.
        issued.sort_unstable_by_key(|(d, _)| *d);
        KeyRecords::from_iter(issued)
    }
}

/// A digest's hash as a field spells it (32 hex digits), as a number.
fn hash_of(hex: &str) -> Option<u128> {
    let ours = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if hex.len() != 32 || !hex.bytes().all(ours) {
        return None;
    }
    u128::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::super::redis_set;
    use super::*;
    use crate::policy::overrides::{Change, IssuedKey, Part};

    fn change(since_ms: u64) -> Change {
        Change {
            since_ms,
            by: "admin".into(),
            reason: None,
        }
    }

    fn issued(name: &str, id: Digest) -> KeyRecord {
        KeyRecord {
            issued: Some(Box::new(IssuedKey {
                id,
                digest: id,
                previous: Vec::new(),
                plan_id: 1,
                partner: None,
                expires_ms: None,
                requests_per_window: None,
                quota: None,
                change: change(1),
                rotated_ms: None,
            })),
            ..KeyRecord::named(name)
        }
    }

    /// The records in force for `policy` of `read` (fields as kept), gathered from their
    /// text as a whole read and a start gather them.
    fn from_fields(policy: &Policy, read: &Fields) -> KeyRecords {
        let page = read.iter().map(|(f, k)| (f.clone(), k.raw())).collect();
        gather([page], read.len()).parts.into_set(policy)
    }

    /// Each field as a store holds it: the record's `part` alone, at version 1.
    fn fields(records: &[(Digest, Part, KeyRecord)]) -> Fields {
        records
            .iter()
            .map(|(d, part, o)| {
                let only = o.only(*part).unwrap_or_else(|| KeyRecord::named(&o.key));
                (redis_set::part_field(d, *part), Kept::new(1, &only))
            })
            .collect()
    }

    #[test]
    fn the_parts_read_are_merged_by_digest_and_matched_to_issued_and_configured_keys() {
        let config = tollgate_core::testing::config();
        let yaml = config.keys.iter().find(|k| k.name == "basic-1").unwrap();
        let (yaml_name, yaml_digest) = (yaml.name.as_str().to_string(), yaml.digest);
        let policy = Policy::new(config, None);
        let (a, b) = (Digest::of(b"issued-a"), Digest::of(b"issued-b"));
        let suspended = |name: &str| KeyRecord {
            suspended: Some(Box::new(change(2))),
            ..KeyRecord::named(name)
        };
        let gone = Digest::of(b"a key no config holds");
        let revoked = KeyRecord {
            revoked: Some(Box::new(change(3))),
            ..KeyRecord::named("renamed-since")
        };
        let mut read = fields(&[
            (a, Part::Issued, issued("a", a)),
            (a, Part::Suspended, suspended("a")),
            (b, Part::Issued, issued("b", b)),
            (yaml_digest, Part::Suspended, suspended(&yaml_name)),
            // A part of a digest no key has: let go.
            (gone, Part::Suspended, suspended("nobody")),
            // A part taken out (a tombstone): holds nothing.
            (b, Part::Limit, KeyRecord::named("b")),
        ]);
        // An issued record under a field that is not its digest's is not taken for the digest
        // it names.
        let (stray, named) = (Digest::of(b"stray"), Digest::of(b"named"));
        read.insert(
            redis_set::part_field(&stray, Part::Issued),
            Kept::new(1, &issued("stray", named)),
        );
        // Not a field of ours.
        read.insert("~epoch".into(), Kept::new(1, &suspended("x")));
        let set = from_fields(&policy, &read);
        assert_eq!(
            set.keys().copied().collect::<Vec<_>>(),
            {
                let mut want = vec![a, b, yaml_digest];
                want.sort();
                want
            },
            "each digest once, in order; nothing for a digest no key has"
        );
        let got_a = set.record(&a).unwrap();
        assert!(got_a.issued.is_some() && got_a.suspended.is_some());
        assert_eq!(got_a.key, "a");
        assert!(
            set.record(&b).unwrap().suspended.is_none() && set.record(&b).unwrap().limit.is_none()
        );
        assert!(set.record(&yaml_digest).unwrap().suspended.is_some());
        assert_eq!(set.record(&yaml_digest).unwrap().key, yaml_name);

        // A revocation of a key renamed since (its name in no entry): found by hashing every
        // digest, so it still refuses the key under its new name.
        let read = fields(&[(yaml_digest, Part::Revoked, revoked)]);
        let set = from_fields(&policy, &read);
        assert!(set.record(&yaml_digest).unwrap().revoked.is_some());
    }

    #[test]
    fn a_field_hash_is_ours_only_in_lowercase_hex_of_its_length() {
        let f = redis_set::field(&Digest::of(b"k"));
        assert!(hash_of(&f).is_some());
        assert_eq!(hash_of(&f.to_uppercase()), None);
        assert_eq!(hash_of(&f[..31]), None);
        assert_eq!(hash_of(&format!("+{}", &f[1..])), None);
        assert_eq!(hash_of("~epoch"), None);
    }
}
