//! Maps a field path such as `keys[2].sha256` to the line it sits on in a YAML file.
//!
//! serde_yaml reports the line of syntax and type errors itself, but the semantic checks
//! (duplicate digests, a key naming a missing plan, …) run on typed structs that no longer know
//! where they came from. Rather than thread spans through every struct, the loader asks this
//! index afterwards: one pass over the parser's marked events finds the line of each key and
//! sequence item it was asked for, keyed by the same path syntax the validator uses.
//!
//! The walk happens only when a line is asked for — for an error, or for a warning — never for a
//! config that loads cleanly: a file with a million keys has some eight million nodes, and
//! recording the line of every one of them up front cost seconds and hundreds of megabytes.

use std::collections::{HashMap, HashSet};

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::Marker;

/// Finds the lines (1-based) of field paths in one YAML document, on demand.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LineIndex<'a> {
    text: &'a str,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self { text }
    }

    /// The line of `path`, or of its nearest ancestor that exists in the file (a missing field is
    /// reported at the mapping that lacks it). A document the parser cannot read up to `path`
    /// yields `None`: serde_yaml has already reported the syntax error with its own position by
    /// then. (The walk stops once `path` is found, so a break after it goes unnoticed.)
    pub(crate) fn line_of(&self, path: &str) -> Option<usize> {
        self.lines_of(&[path])[0]
    }

    /// [`LineIndex::line_of`] for several paths, in one walk of the document.
    pub(crate) fn lines_of(&self, paths: &[&str]) -> Vec<Option<usize>> {
        let mut wanted: HashSet<String> = HashSet::new();
        for path in paths {
            let mut p = *path;
            wanted.insert(p.to_owned());
            while let Some(cut) = p.rfind(['.', '[']) {
                p = &p[..cut];
                wanted.insert(p.to_owned());
            }
        }
        let exact: HashSet<&str> = paths.iter().copied().collect();
        let mut walker = Walker {
            wanted,
            exact_left: exact.len(),
            exact,
            stack: Vec::new(),
            lines: HashMap::new(),
        };
        // The first document, event by event, until every path asked for is found.
        let mut parser = Parser::new_from_str(self.text);
        while walker.exact_left > 0 {
            match parser.next_token() {
                Ok((Event::DocumentEnd | Event::StreamEnd, _)) => break,
                Ok((ev, mark)) => walker.on_event(ev, mark),
                // Not YAML before everything was found: positions from half a file would mislead.
                Err(_) => return vec![None; paths.len()],
            }
        }
        paths
            .iter()
            .map(|path| {
                let mut p = *path;
                loop {
                    if let Some(line) = walker.lines.get(p) {
                        return Some(*line);
                    }
                    let cut = p.rfind(['.', '['])?;
                    p = &p[..cut];
                }
            })
            .collect()
    }
}

enum Frame {
    /// `path` is `None` for a node whose children cannot be wanted (its own path is not).
    Map {
        path: Option<String>,
        key: Option<String>,
    },
    Seq {
        path: Option<String>,
        index: usize,
    },
}

/// Records the first line of each wanted path (of a mapping key: its key; of a sequence item: its
/// first line). Paths are only spelled out under a wanted parent
/// (the wanted set holds every ancestor of a wanted path), so the walk allocates little beyond
/// what the parser itself does.
struct Walker<'p> {
    wanted: HashSet<String>,
    exact: HashSet<&'p str>,
    /// Wanted paths (not ancestors) not found yet; the walk ends when this reaches zero.
    exact_left: usize,
    stack: Vec<Frame>,
    lines: HashMap<String, usize>,
}

impl Walker<'_> {
    fn found(&mut self, path: &str, line: usize) {
        if self.wanted.contains(path) && !self.lines.contains_key(path) {
            self.lines.insert(path.to_owned(), line);
            if self.exact.contains(path) {
                self.exact_left -= 1;
            }
        }
    }

    /// Called for every node. Returns `Some(path)` when it is a value (not a mapping key), with
    /// the path itself only when it is wanted.
    fn node(&mut self, scalar: Option<&str>, line: usize) -> Option<Option<String>> {
        let (full, is_key) = match self.stack.last_mut() {
            // The document itself: always walked into, never recorded.
            None => return Some(Some(String::new())),
            Some(Frame::Map { path, key }) => match key.take() {
                None => {
                    let name = scalar.unwrap_or("?").to_owned();
                    let full = path.as_deref().map(|p| join(p, &name));
                    *key = Some(name);
                    (full, true)
                }
                Some(name) => (path.as_deref().map(|p| join(p, &name)), false),
            },
            Some(Frame::Seq { path, index }) => {
                let full = path.as_deref().map(|p| format!("{p}[{index}]"));
                *index += 1;
                (full, false)
            }
        };
        if let Some(f) = &full {
            self.found(f, line);
        }
        if is_key {
            return None;
        }
        Some(full.filter(|f| self.wanted.contains(f)))
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

impl Walker<'_> {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let line = mark.line();
        match ev {
            Event::Scalar(value, ..) => {
                self.node(Some(&value), line);
            }
            Event::Alias(_) => {
                self.node(None, line);
            }
            Event::MappingStart(..) => {
                if let Some(path) = self.node(None, line) {
                    self.stack.push(Frame::Map { path, key: None });
                }
            }
            Event::SequenceStart(..) => {
                if let Some(path) = self.node(None, line) {
                    self.stack.push(Frame::Seq { path, index: 0 });
                }
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_keys_and_items() {
        let text = "listen: a\nplans:\n  basic:\n    allow: [x, y]\nkeys:\n  - name: one\n    plan: basic\n  - name: two\n    sha256: abc\n";
        let idx = LineIndex::new(text);
        assert_eq!(idx.line_of("listen"), Some(1));
        assert_eq!(idx.line_of("plans.basic.allow"), Some(4));
        assert_eq!(idx.line_of("keys[0].plan"), Some(7));
        assert_eq!(idx.line_of("keys[1]"), Some(8));
        assert_eq!(idx.line_of("keys[1].sha256"), Some(9));
        // A missing field falls back to its mapping.
        assert_eq!(idx.line_of("keys[1].plan"), Some(8));
        assert_eq!(idx.line_of("nowhere"), None);
        assert_eq!(idx.line_of(""), None);
        // Several at once, in one walk, in the order asked.
        assert_eq!(
            idx.lines_of(&["keys[1].sha256", "plans.basic", "keys[0]", "keys[7].x"]),
            vec![Some(9), Some(3), Some(6), Some(5)]
        );
    }

    #[test]
    fn the_first_occurrence_wins_and_broken_yaml_has_no_lines() {
        let text = "a: 1\na: 2\n";
        assert_eq!(LineIndex::new(text).line_of("a"), Some(1));
        // Broken before the path is found: no line. (Found before the break: its line.)
        let broken = "a: [oops\nb: 1\n";
        assert_eq!(LineIndex::new(broken).line_of("b"), None);
        assert_eq!(
            LineIndex::new(broken).lines_of(&["a", "b"]),
            vec![None, None]
        );
        assert_eq!(LineIndex::new(broken).line_of("a"), Some(1));
    }
}
