//! Where quota counts and ledger rows are kept: the `state.path` file (redb, beside the
//! overrides), or memory.
//!
//! Two tables: `quota_used`, from a key's name to its quota word (the period's id and the
//! requests charged in it, 12 bytes); `ledger`, from a UTC day and a key's name (the day's
//! number big-endian first, so a range of days is a range of keys) to that day's row as JSON.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use redb::{ReadableTable, TableDefinition};

use crate::state::disk::read_table;
use crate::state::StateFile;
use crate::sync::Locked;
use serde::{Deserialize, Serialize};

const QUOTA: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("quota_used");
const LEDGER: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("ledger");

/// One key's counts for one UTC day, by column name (`upstream_2xx`, `rate_limited`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Row {
    /// The key's plan when last counted (`partner` for a partner key).
    pub plan: String,
    /// The key's partner: the partner managing a customer key, or a partner key's own name.
    pub partner: Option<String>,
    /// Counts by column.
    pub counts: BTreeMap<String, u64>,
}

/// A change to one row: counts to add, and who the key is now.
pub(crate) struct Delta {
    pub day: u32,
    pub key: String,
    pub plan: String,
    pub partner: Option<String>,
    pub counts: Vec<(&'static str, u64)>,
}

/// Why the book could not keep or read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BookError(pub String);

fn err(e: impl std::fmt::Display) -> BookError {
    BookError(e.to_string())
}

/// The store.
pub(crate) enum Book {
    Memory(Mutex<Memory>),
    Disk(Arc<StateFile>),
}

/// The book in memory (no `state.path`): lost with the process.
#[derive(Default)]
pub(crate) struct Memory {
    quota: BTreeMap<String, (u32, u64)>,
    rows: BTreeMap<(u32, String), Row>,
}

fn ledger_key(day: u32, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + key.len());
    k.extend_from_slice(&day.to_be_bytes());
    k.extend_from_slice(key.as_bytes());
    k
}

fn parse_ledger_key(k: &[u8]) -> Option<(u32, String)> {
    let day = u32::from_be_bytes(k.get(..4)?.try_into().ok()?);
    Some((day, String::from_utf8(k[4..].to_vec()).ok()?))
}

fn add(row: &mut Row, d: &Delta) {
    row.plan.clone_from(&d.plan);
    row.partner.clone_from(&d.partner);
    for &(col, n) in &d.counts {
        *row.counts.entry(col.to_string()).or_insert(0) += n;
    }
}

impl Book {
    /// Every quota word kept, by key name.
    pub(crate) fn quotas(&self) -> Result<Vec<(String, u32, u64)>, BookError> {
        match self {
            Book::Memory(m) => Ok(m
                .locked()
                .quota
                .iter()
                .map(|(k, &(id, n))| (k.clone(), id, n))
                .collect()),
            Book::Disk(file) => file.read(|db| {
                let Some(table) = read_table(db, QUOTA).map_err(err)? else {
                    return Ok(Vec::new());
                };
                let mut out = Vec::new();
                for row in table.iter().map_err(err)? {
                    let (k, v) = row.map_err(err)?;
                    let v = v.value();
                    if v.len() == 12 {
                        let id = u32::from_be_bytes(v[..4].try_into().expect("4 bytes"));
                        let n = u64::from_be_bytes(v[4..].try_into().expect("8 bytes"));
                        out.push((k.value().to_string(), id, n));
                    }
                }
                Ok(out)
            }),
        }
    }

    /// Keep quota words and add ledger deltas, in one transaction (durable when it returns),
    /// and drop the rows of days before `keep_from`.
    pub(crate) fn write(
        &self,
        quotas: &[(String, u32, u64)],
        deltas: &[Delta],
        keep_from: Option<u32>,
    ) -> Result<(), BookError> {
        match self {
            Book::Memory(m) => {
                let mut m = m.locked();
                for (k, id, n) in quotas {
                    m.quota.insert(k.clone(), (*id, *n));
                }
                for d in deltas {
                    add(m.rows.entry((d.day, d.key.clone())).or_default(), d);
                }
                if let Some(from) = keep_from {
                    m.rows = m.rows.split_off(&(from, String::new()));
                }
                Ok(())
            }
            Book::Disk(file) => file.write(|db| {
                let txn = db.begin_write().map_err(err)?;
                {
                    let mut q = txn.open_table(QUOTA).map_err(err)?;
                    for (k, id, n) in quotas {
                        let mut v = [0u8; 12];
                        v[..4].copy_from_slice(&id.to_be_bytes());
                        v[4..].copy_from_slice(&n.to_be_bytes());
                        q.insert(k.as_str(), &v[..]).map_err(err)?;
                    }
                    let mut l = txn.open_table(LEDGER).map_err(err)?;
                    for d in deltas {
                        let key = ledger_key(d.day, &d.key);
                        let mut row = match l.get(&key[..]).map_err(err)? {
                            Some(v) => serde_json::from_slice(v.value()).unwrap_or_default(),
                            None => Row::default(),
                        };
                        add(&mut row, d);
                        let json = serde_json::to_vec(&row).map_err(err)?;
                        l.insert(&key[..], &json[..]).map_err(err)?;
                    }
                    if let Some(from) = keep_from {
                        let end = from.to_be_bytes();
                        l.retain_in(..&end[..], |_, _| false).map_err(err)?;
                    }
                }
                txn.commit().map_err(err)
            }),
        }
    }

    /// The rows of days `from..=to` (of the key named `key`, if given), by day then key.
    pub(crate) fn rows(
        &self,
        from: u32,
        to: u32,
        key: Option<&str>,
    ) -> Result<Vec<(u32, String, Row)>, BookError> {
        let wanted = |k: &str| key.is_none_or(|want| want == k);
        match self {
            Book::Memory(m) => Ok(m
                .locked()
                .rows
                .range((from, String::new())..)
                .take_while(|((day, _), _)| *day <= to)
                .filter(|((_, k), _)| wanted(k))
                .map(|((day, k), r)| (*day, k.clone(), r.clone()))
                .collect()),
            Book::Disk(file) => file.read(|db| {
                let Some(table) = read_table(db, LEDGER).map_err(err)? else {
                    return Ok(Vec::new());
                };
                let (lo, hi) = (from.to_be_bytes(), to.saturating_add(1).to_be_bytes());
                let mut out = Vec::new();
                for row in table.range(&lo[..]..&hi[..]).map_err(err)? {
                    let (k, v) = row.map_err(err)?;
                    let Some((day, name)) = parse_ledger_key(k.value()) else {
                        continue;
                    };
                    if day > to || !wanted(&name) {
                        continue;
                    }
                    if let Ok(r) = serde_json::from_slice::<Row>(v.value()) {
                        out.push((day, name, r));
                    }
                }
                Ok(out)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(day: u32, key: &str, n: u64) -> Delta {
        Delta {
            day,
            key: key.into(),
            plan: "basic".into(),
            partner: None,
            counts: vec![("upstream_2xx", n), ("rate_limited", 1)],
        }
    }

    fn both() -> (Vec<Book>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::open(&dir.path().join("state.db")).unwrap();
        (vec![Book::Memory(Mutex::default()), Book::Disk(file)], dir)
    }

    #[test]
    fn rows_add_up_by_day_and_key_and_old_days_are_dropped() {
        let (books, _dir) = both();
        for book in books {
            book.write(
                &[("a".into(), 7, 3)],
                &[delta(10, "a", 2), delta(11, "b", 1)],
                None,
            )
            .unwrap();
            book.write(&[("a".into(), 7, 5)], &[delta(10, "a", 3)], None)
                .unwrap();
            assert_eq!(book.quotas().unwrap(), vec![("a".to_string(), 7, 5)]);
            let rows = book.rows(10, 11, None).unwrap();
            assert_eq!(rows.len(), 2);
            assert_eq!((rows[0].0, rows[0].1.as_str()), (10, "a"));
            assert_eq!(rows[0].2.counts["upstream_2xx"], 5);
            assert_eq!(rows[0].2.counts["rate_limited"], 2);
            assert_eq!(book.rows(11, 11, None).unwrap().len(), 1);
            assert_eq!(book.rows(10, 11, Some("b")).unwrap().len(), 1);
            assert!(book.rows(12, 20, None).unwrap().is_empty());
            book.write(&[], &[], Some(11)).unwrap();
            let rows = book.rows(0, 20, None).unwrap();
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].1, "b");
        }
    }
}
