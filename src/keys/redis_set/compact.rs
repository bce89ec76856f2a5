//! The compact copy of the set: every field of the set with its text as of one version, in a
//! few large values, so that a replica that must read the set whole (a start, or a replica
//! too far behind for the log) reads some tens of values instead of walking a million
//! fields in `HSCAN` pages (docs/cluster.md, "The compact copy"). Redis answers a value of a
//! few megabytes by copying it; a page of 2,000 fields costs it 2.9 ms of walking and making
//! an object of each field (docs/keyscale.md, "A start from Redis alone, where it waits").
//!
//! | key | what |
//! |---|---|
//! | `{<prefix>:ov}:compact` | the header: the set's epoch and version the copy is of, its generation, how many chunks and fields, its format |
//! | `{<prefix>:ov}:compact:<generation>:<i>` | the chunks: each a zstd frame of entries, each a field and its text, each length-prefixed ([`push`]) |
//! | `{<prefix>:ov}:compact:lock` | the replica writing a copy now, and not again for a minute |
//!
//! A copy is *of version V* when every field the set held at V is in it with its text at V or
//! later: the copy is made by one replica reading the set in pages after reading V, as a
//! whole read does, and each change after V is logged at a later version. So the copy and
//! the fields the log names since V (read at the time of the copy's read, with their texts
//! then) are the set at that time, as a whole read would have found it. A copy the log no
//! longer covers (more changed since than a delta holds), or whose header cannot be the
//! set's ([`Status::usable`]), is not used, nor one whose chunks are not what its header
//! says (the reader's check, `keys::sync`): the set is read in pages, and a damaged copy
//! taken out ([`RedisSet::drop_compact`]) so that another is written.

use std::collections::HashSet;
use std::hash::BuildHasher;
use std::time::Duration;

use super::{scan_into, split_field, RedisSet, MAX_DELTA, PAGE, TTL};
use crate::fleet_store::{within, StoreError};

/// The format this version writes and reads (a header of another is not read: the set is).
pub(crate) const FORMAT: &str = "1";

/// A set of fewer fields is read in a page or so: no copy is written for it.
pub(crate) const MIN_FIELDS: u64 = PAGE as u64;

/// A copy with more fields changed since it than this is written again (half what a delta
/// holds: it is still read until twice as many have changed).
pub(crate) const STALE: u64 = (MAX_DELTA / 2) as u64;

/// The entries' bytes a chunk holds before it is compressed (about 1.1 MB after: a `GET` of
/// a few milliseconds at most, within any `timeout_ms`).
const CHUNK_BYTES: usize = 4 << 20;

/// How long a chunk lives before its header names it (a writer that stops half-way leaves
/// nothing for long).
const UNFINISHED: Duration = Duration::from_secs(600);

/// How long after it was claimed a replica may write a copy again: across the fleet, one
/// copy a minute at most (a copy of a million fields costs Redis about as much as one start
/// that walks the set).
const CLAIM: Duration = Duration::from_secs(60);

/// The most bytes a chunk's entries may take once decompressed: a chunk is written as soon
/// as its entries pass [`CHUNK_BYTES`], one entry past it at most (an entry is a field of the
/// set, within the admin API's body limit); a chunk that says it holds more is not one (a
/// bound on what a damaged value costs).
const MOST_BYTES: usize = 2 * CHUNK_BYTES;

/// The most chunks a header may name for a copy to be of use (a million issued keys take
/// 63): also the most a replica names when it lets a copy's chunks expire.
const MOST_CHUNKS: u32 = 4096;

/// The first entry of every chunk: its place, `<generation>:<i>` ([`place`]). A chunk read
/// under another name (another copy's, or another of this copy's) is not taken for it.
const MARK: &str = "~chunk";

/// The place a chunk's first entry names.
pub(crate) fn place(generation: &str, i: u32) -> String {
    format!("{generation}:{i}")
}

/// zstd's level for the chunks: its fastest (the texts' hex digests do not compress).
const LEVEL: i32 = 1;

/// A copy's header as Redis holds it (each number read as one: a header whose numbers are
/// not is none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub epoch: String,
    pub version: u64,
    pub generation: String,
    pub chunks: u32,
    pub fields: u64,
    pub format: String,
}

/// The set and its copy now (`compact.lua`'s status).
#[derive(Clone, Debug)]
pub(crate) struct Status {
    /// The set's epoch ('' for none).
    pub epoch: String,
    /// How many fields the set holds.
    pub fields: u64,
    /// The set's version.
    pub version: u64,
    pub header: Option<Header>,
    /// The generation the header names, as it is ('' for none): a header whose numbers cannot
    /// be read is replaced all the same.
    pub generation: String,
    /// How many fields the log names since the copy's version (`None`: the log cannot say).
    pub since: Option<u64>,
}

impl Status {
    /// Whether the copy should be written (again): the set is big enough, and there is no
    /// copy of its epoch in this format, or the log names more than [`STALE`] fields since.
    pub(crate) fn wants_copy(&self) -> bool {
        let fresh = self.header.as_ref().is_some_and(|h| self.holds(h))
            && self.since.is_some_and(|n| n <= STALE);
        self.fields >= MIN_FIELDS && !self.epoch.is_empty() && !fresh
    }

    /// Whether `h` can be a copy of this set: of its epoch, in this format, of a version the
    /// set has had, of no more fields than the set holds (fields are never taken out of a
    /// set, only marked: a copy of more is not of this set) and no fewer than a copy is
    /// written for, in one chunk at least and no more than [`MOST_CHUNKS`].
    fn holds(&self, h: &Header) -> bool {
        h.epoch == self.epoch
            && h.format == FORMAT
            && h.version <= self.version
            && (MIN_FIELDS..=self.fields).contains(&h.fields)
            && (1..=MOST_CHUNKS).contains(&h.chunks)
    }

    /// The copy's header, when it can be a copy of this set ([`Status::holds`]) and the set's
    /// epoch is `epoch`.
    pub(crate) fn usable(&self, epoch: &str) -> Option<Header> {
        let h = self.header.as_ref()?;
        (self.epoch == epoch && self.holds(h)).then(|| h.clone())
    }
}

impl RedisSet {
    fn compact_key(&self) -> String {
        format!("{}:compact", self.set_key.trim_end_matches(":set"))
    }

    fn chunk_key(&self, generation: &str, i: u32) -> String {
        format!("{}:{generation}:{i}", self.compact_key())
    }

    /// The set and its copy now.
    pub(crate) async fn compact_status(&self) -> Result<Status, StoreError> {
        let header = self.compact_key();
        let words: Vec<String> = self
            .call(&self.compact, &[&header], |c| {
                c.arg("status");
            })
            .await?;
        let malformed =
            || StoreError::Malformed("the compact copy's status answered another shape");
        let [epoch, fields, set_version, h_epoch, version, generation, chunks, h_fields, format, since] =
            <[String; 10]>::try_from(words).map_err(|_| malformed())?;
        let header = (!generation.is_empty())
            .then(|| {
                Some(Header {
                    epoch: h_epoch,
                    version: version.parse().ok()?,
                    generation: generation.clone(),
                    chunks: chunks.parse().ok()?,
                    fields: h_fields.parse().ok()?,
                    format,
                })
            })
            .flatten();
        Ok(Status {
            epoch,
            fields: fields.parse().map_err(|_| malformed())?,
            version: set_version.parse().map_err(|_| malformed())?,
            header,
            generation,
            since: since.parse().ok(),
        })
    }

    /// Take out the copy `h`, found damaged, when the header still names it: the next look
    /// writes another (its chunks expire a minute later).
    pub(crate) async fn drop_compact(&self, h: &Header) -> Result<(), StoreError> {
        let mut keys = vec![self.compact_key()];
        keys.extend((0..h.chunks.min(MOST_CHUNKS)).map(|i| self.chunk_key(&h.generation, i)));
        let more: Vec<&str> = keys.iter().map(String::as_str).collect();
        let _: u8 = self
            .call(&self.compact, &more, |c| {
                c.arg("drop").arg(&h.generation);
            })
            .await?;
        Ok(())
    }

    /// The chunk `i` of the copy `h` (`None`: gone), within the timeout.
    pub(crate) async fn compact_chunk(
        &self,
        h: &Header,
        i: u32,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let client = self.client().await?;
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut cmd = ::redis::cmd("GET");
        cmd.arg(self.chunk_key(&h.generation, i));
        let r = within(deadline, &self.cfg.redis_url, client.query(&cmd)).await;
        self.settled(r).await
    }

    /// Whether this replica may write the copy now: none has in the last [`CLAIM`].
    pub(crate) async fn claim_compact(&self) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(format!("{}:lock", self.compact_key()))
            .arg(super::new_epoch())
            .arg("NX")
            .arg("PX")
            .arg(CLAIM.as_millis() as u64);
        let r: Result<Option<String>, _> =
            within(deadline, &self.cfg.redis_url, client.query(&cmd)).await;
        Ok(self.settled(r).await?.is_some())
    }

    /// Write the copy of the set of epoch `status.epoch` (replacing `status.header`'s): read
    /// the set's version, then the set in pages, each page's fields into chunks as they come;
    /// the header last, when the set still has the epoch. The header put, or `None` when the
    /// set moved to another epoch, another replica's copy took its place, or a field came
    /// twice (the set's table grew during the read: the next try finds it settled).
    pub(crate) async fn write_compact(
        &self,
        status: &Status,
    ) -> Result<Option<Header>, StoreError> {
        let epoch = &status.epoch;
        let (version, about) = match self.poll("", epoch).await? {
            super::Polled::Whole { version, fields } => (version, fields),
            _ => return Ok(None),
        };
        let generation = super::new_epoch();
        let client = self.client().await?;
        let (pages, mut rx) = tokio::sync::mpsc::channel::<Vec<(String, String)>>(4);
        let read = async move {
            let r = scan_into(&client, &self.cfg, &self.set_key, about, &pages).await;
            drop(pages);
            r
        };
        let write = async {
            let seen_hash = foldhash::fast::RandomState::default();
            let mut seen = HashSet::with_capacity(usize::try_from(about).unwrap_or(0));
            let mut entries = Vec::with_capacity(CHUNK_BYTES + (64 << 10));
            let (mut chunks, mut fields) = (0u32, 0u64);
            while let Some(page) = rx.recv().await {
                for (f, text) in page {
                    if split_field(&f).is_none() {
                        continue;
                    }
                    if !seen.insert(seen_hash.hash_one(&f)) {
                        return Ok(None);
                    }
                    if entries.is_empty() {
                        push(&mut entries, MARK, &place(&generation, chunks));
                    }
                    push(&mut entries, &f, &text);
                    fields += 1;
                    // A chunk holds CHUNK_BYTES and one entry at most (`MOST_BYTES`).
                    if entries.len() >= CHUNK_BYTES {
                        self.put_chunk(&generation, chunks, std::mem::take(&mut entries))
                            .await?;
                        chunks += 1;
                    }
                }
            }
            if !entries.is_empty() || chunks == 0 {
                if entries.is_empty() {
                    push(&mut entries, MARK, &place(&generation, chunks));
                }
                self.put_chunk(&generation, chunks, entries).await?;
                chunks += 1;
            }
            Ok::<_, StoreError>(Some((chunks, fields)))
        };
        let (read, written) = tokio::join!(read, write);
        let Some((chunks, fields)) = written? else {
            return Ok(None);
        };
        read?;
        let header = self.compact_key();
        let mut keys: Vec<String> = vec![header];
        keys.extend((0..chunks).map(|i| self.chunk_key(&generation, i)));
        let old = status.header.as_ref();
        if let Some(h) = old {
            keys.extend((0..h.chunks.min(MOST_CHUNKS)).map(|i| self.chunk_key(&h.generation, i)));
        }
        let more: Vec<&str> = keys.iter().map(String::as_str).collect();
        let put: u8 = self
            .call(&self.compact, &more, |c| {
                c.arg("finish")
                    .arg(epoch)
                    .arg(&version)
                    .arg(&generation)
                    .arg(chunks)
                    .arg(fields)
                    .arg(TTL.as_millis() as u64)
                    .arg(&status.generation)
                    .arg(FORMAT);
            })
            .await?;
        Ok((put == 1).then(|| Header {
            epoch: epoch.clone(),
            version: version.parse().unwrap_or_default(),
            generation,
            chunks,
            fields,
            format: FORMAT.to_string(),
        }))
    }

    /// Compress `entries` (off the runtime's threads) and keep them as chunk `i`, for
    /// [`UNFINISHED`] until the header names them.
    async fn put_chunk(
        &self,
        generation: &str,
        i: u32,
        entries: Vec<u8>,
    ) -> Result<(), StoreError> {
        let packed = tokio::task::spawn_blocking(move || compress(&entries))
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(StoreError::Malformed(
                "the compact copy's chunk was not compressed",
            ))?;
        let client = self.client().await?;
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut cmd = ::redis::cmd("SET");
        cmd.arg(self.chunk_key(generation, i))
            .arg(packed)
            .arg("PX")
            .arg(UNFINISHED.as_millis() as u64);
        let r: Result<(), _> = within(deadline, &self.cfg.redis_url, client.query(&cmd)).await;
        self.settled(r).await
    }
}

/// A chunk's entries compressed, with zstd's checksum of them (a chunk damaged in Redis
/// is found so when read).
fn compress(entries: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut z = zstd::bulk::Compressor::new(LEVEL)?;
    z.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    z.compress(entries)
}

/// Append a field and its text to a chunk's entries: each its length (4 bytes, little-endian)
/// then its bytes.
pub(crate) fn push(entries: &mut Vec<u8>, field: &str, text: &str) {
    for s in [field, text] {
        let n = u32::try_from(s.len()).unwrap_or(u32::MAX);
        entries.extend_from_slice(&n.to_le_bytes());
        entries.extend_from_slice(&s.as_bytes()[..n as usize]);
    }
}

/// Each field of a chunk and its text, as [`push`] wrote them, handed to `each` in order
/// (borrowed from the chunk's bytes, decompressed into `room`, which a reader keeps from one
/// chunk to the next: no copy of a text is made, and no buffer of megabytes each time).
/// Whether the chunk was one of this format, whole, and the one at `at` ([`place`], its first
/// entry): when not, what was handed before is to be let go.
pub(crate) fn read_chunk(
    chunk: &[u8],
    room: &mut Room,
    at: &str,
    mut each: impl FnMut(&str, &str),
) -> bool {
    // The frame names its size (the writer's `compress` puts it there): room for that alone.
    let size = zstd::zstd_safe::get_frame_content_size(chunk)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| n <= MOST_BYTES);
    let Some(size) = size else {
        return false;
    };
    let Room { zstd, entries } = room;
    entries.clear();
    entries.reserve(size);
    let Some(z) = zstd.as_mut() else {
        return false;
    };
    if z.decompress_to_buffer(chunk, entries).is_err() {
        return false;
    }
    let mut rest = entries.as_slice();
    if (take(&mut rest), take(&mut rest)) != (Some(MARK), Some(at)) {
        return false;
    }
    while !rest.is_empty() {
        let (Some(f), Some(text)) = (take(&mut rest), take(&mut rest)) else {
            return false;
        };
        each(f, text);
    }
    true
}

/// What a reader of chunks keeps from one to the next ([`read_chunk`]).
pub(crate) struct Room {
    zstd: Option<zstd::bulk::Decompressor<'static>>,
    entries: Vec<u8>,
}

impl Default for Room {
    fn default() -> Self {
        Self {
            zstd: zstd::bulk::Decompressor::new().ok(),
            entries: Vec::new(),
        }
    }
}

/// The next length-prefixed text of `rest`, taken off it (`None`: cut short, or not UTF-8).
fn take<'a>(rest: &mut &'a [u8]) -> Option<&'a str> {
    let (n, after) = rest.split_first_chunk::<4>()?;
    let n = u32::from_le_bytes(*n) as usize;
    let s = after.get(..n)?;
    *rest = &after[n..];
    std::str::from_utf8(s).ok()
}

/// The fields and texts of the chunk at `g:0` (`None`: not that chunk of this format).
#[cfg(test)]
pub(crate) fn decode(chunk: &[u8]) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    read_chunk(chunk, &mut Room::default(), "g:0", |f, text| {
        out.push((f.to_string(), text.to_string()))
    })
    .then_some(out)
}

/// The chunk `at` of `fields`, as the copy keeps it.
#[cfg(test)]
pub(crate) fn encode_at(at: &str, fields: &[(String, String)]) -> Vec<u8> {
    let mut entries = Vec::new();
    push(&mut entries, MARK, at);
    for (f, text) in fields {
        push(&mut entries, f, text);
    }
    compress(&entries).unwrap_or_default()
}

/// The chunk `g:0` of `fields`.
#[cfg(test)]
pub(crate) fn encode(fields: &[(String, String)]) -> Vec<u8> {
    encode_at("g:0", fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_gives_back_its_fields_and_anything_else_is_no_chunk() {
        let fields = vec![
            (
                "0123456789abcdef0123456789abcdef".to_string(),
                "0000000000000001|{\"key\":\"a\"}".to_string(),
            ),
            (
                "0123456789abcdef0123456789abcdef:s".to_string(),
                String::new(),
            ),
            (
                "ffffffffffffffffffffffffffffffff".to_string(),
                "é ünïcode".to_string(),
            ),
        ];
        let chunk = encode(&fields);
        assert_eq!(decode(&chunk), Some(fields.clone()));
        assert_eq!(decode(&encode(&[])), Some(Vec::new()));
        // Not zstd, a frame cut short, entries cut short, a length past the end, bytes that
        // are not UTF-8, more bytes than a chunk holds.
        assert_eq!(decode(b"not a chunk"), None);
        assert_eq!(decode(&chunk[..chunk.len() / 2]), None);
        // Another chunk's (another copy's, or another of this one's); one without its place;
        // one damaged (zstd's checksum).
        assert_eq!(decode(&encode_at("g:1", &fields)), None);
        assert_eq!(decode(&encode_at("f:0", &fields)), None);
        let mut unplaced = Vec::new();
        push(&mut unplaced, &fields[0].0, &fields[0].1);
        assert_eq!(decode(&compress(&unplaced).unwrap()), None);
        let mut flipped = chunk.clone();
        let at = flipped.len() - 6;
        flipped[at] ^= 1;
        assert_eq!(decode(&flipped), None);
        let mut entries = Vec::new();
        push(&mut entries, MARK, "g:0");
        push(&mut entries, "abc", "def");
        for cut in [entries.len() - 1, 22, 19, 14] {
            let short = zstd::bulk::compress(&entries[..cut], LEVEL).unwrap();
            assert_eq!(decode(&short), None, "cut at {cut}");
        }
        let mut long = entries.clone();
        long[17] = 200;
        assert_eq!(decode(&zstd::bulk::compress(&long, LEVEL).unwrap()), None);
        let mut bad = Vec::new();
        push(&mut bad, MARK, "g:0");
        bad.extend_from_slice(&2u32.to_le_bytes());
        bad.extend_from_slice(&[0xff, 0xfe]);
        bad.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(decode(&zstd::bulk::compress(&bad, LEVEL).unwrap()), None);
        let big = vec![0u8; MOST_BYTES + 1];
        assert_eq!(decode(&zstd::bulk::compress(&big, LEVEL).unwrap()), None);
    }

    fn status(fields: u64, header: Option<(&str, &str)>, since: Option<u64>) -> Status {
        Status {
            epoch: "e1".into(),
            fields,
            version: 12,
            generation: if header.is_some() { "g" } else { "" }.into(),
            header: header.map(|(epoch, format)| Header {
                epoch: epoch.into(),
                version: 10,
                generation: "g".into(),
                chunks: 1,
                fields,
                format: format.into(),
            }),
            since,
        }
    }

    #[test]
    fn a_copy_is_written_for_a_big_set_without_a_fresh_one_and_read_only_of_its_epoch() {
        let big = MIN_FIELDS;
        assert!(!status(big - 1, None, None).wants_copy(), "a small set");
        assert!(status(big, None, None).wants_copy(), "no copy");
        assert!(
            !status(big, Some(("e1", FORMAT)), Some(STALE)).wants_copy(),
            "fresh"
        );
        assert!(
            status(big, Some(("e1", FORMAT)), Some(STALE + 1)).wants_copy(),
            "stale"
        );
        assert!(
            status(big, Some(("e1", FORMAT)), None).wants_copy(),
            "the log cannot say"
        );
        assert!(
            status(big, Some(("e0", FORMAT)), Some(0)).wants_copy(),
            "another epoch"
        );
        assert!(
            status(big, Some(("e1", "0")), Some(0)).wants_copy(),
            "another format"
        );
        // A header that says what the set cannot have been: of more fields than the set
        // holds, of a version the set has not reached.
        let mut more = status(big, Some(("e1", FORMAT)), Some(0));
        more.header.as_mut().unwrap().fields = big + 1;
        assert!(
            more.wants_copy() && more.usable("e1").is_none(),
            "more fields"
        );
        let mut later = status(big, Some(("e1", FORMAT)), Some(0));
        later.header.as_mut().unwrap().version = 13;
        assert!(
            later.wants_copy() && later.usable("e1").is_none(),
            "a later version"
        );
        later.header.as_mut().unwrap().version = 12;
        assert!(
            !later.wants_copy() && later.usable("e1").is_some(),
            "the set's version"
        );
        for (fields, chunks) in [(big - 1, 1), (big, 0), (big, MOST_CHUNKS + 1)] {
            let mut odd = status(big, Some(("e1", FORMAT)), Some(0));
            let h = odd.header.as_mut().unwrap();
            (h.fields, h.chunks) = (fields, chunks);
            assert!(
                odd.usable("e1").is_none(),
                "{fields} fields in {chunks} chunks"
            );
        }
        let mut none = status(big, None, None);
        none.epoch.clear();
        assert!(
            !none.wants_copy(),
            "a set without an epoch is put back first"
        );

        assert!(status(big, Some(("e1", FORMAT)), Some(0))
            .usable("e1")
            .is_some());
        assert!(status(big, Some(("e1", FORMAT)), Some(0))
            .usable("e2")
            .is_none());
        assert!(status(big, Some(("e0", FORMAT)), Some(0))
            .usable("e1")
            .is_none());
        assert!(status(big, Some(("e1", "2")), Some(0))
            .usable("e1")
            .is_none());
        assert!(status(big, None, Some(0)).usable("e1").is_none());
    }
}
