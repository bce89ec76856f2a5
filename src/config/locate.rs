//! Maps a field path such as `keys[2].sha256` to the line it sits on in a YAML file.
//!
//! serde_yaml reports the line of syntax and type errors itself, but the semantic checks
//! (duplicate digests, a key naming a missing plan, …) run on typed structs that no longer know
//! where they came from. Rather than thread spans through every struct, the loader asks this
//! index afterwards: one pass over the parser's marked events records the line of every key and
//! sequence item, keyed by the same path syntax the validator uses.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// Line numbers (1-based) of every field path in one YAML document.
#[derive(Debug, Default)]
pub struct LineIndex {
    lines: HashMap<String, usize>,
}

impl LineIndex {
    /// Index `text`. A document the parser cannot read yields an empty index: serde_yaml has
    /// already reported the syntax error with its own position by the time this runs.
    pub fn build(text: &str) -> Self {
        let mut walker = Walker::default();
        let mut parser = Parser::new_from_str(text);
        if parser.load(&mut walker, false).is_err() {
            return Self::default();
        }
        Self {
            lines: walker.lines,
        }
    }

    /// The line of `path`, or of its nearest ancestor that exists in the file (a missing field is
    /// reported at the mapping that lacks it).
    pub fn line_of(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some(line) = self.lines.get(p) {
                return Some(*line);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }
}

enum Frame {
    Map { path: String, key: Option<String> },
    Seq { path: String, index: usize },
}

#[derive(Default)]
struct Walker {
    stack: Vec<Frame>,
    lines: HashMap<String, usize>,
}

impl Walker {
    /// Called for every node. Returns the node's path when it is a value (not a mapping key).
    fn node(&mut self, scalar: Option<&str>, line: usize) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Map { path, key }) => match key.take() {
                None => {
                    let name = scalar.unwrap_or("?").to_owned();
                    let full = join(path, &name);
                    self.lines.entry(full).or_insert(line);
                    *key = Some(name);
                    None
                }
                Some(name) => Some(join(path, &name)),
            },
            Some(Frame::Seq { path, index }) => {
                let full = format!("{path}[{index}]");
                *index += 1;
                self.lines.entry(full.clone()).or_insert(line);
                Some(full)
            }
        }
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

impl MarkedEventReceiver for Walker {
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
        let idx = LineIndex::build(text);
        assert_eq!(idx.line_of("listen"), Some(1));
        assert_eq!(idx.line_of("plans.basic.allow"), Some(4));
        assert_eq!(idx.line_of("keys[0].plan"), Some(7));
        assert_eq!(idx.line_of("keys[1]"), Some(8));
        assert_eq!(idx.line_of("keys[1].sha256"), Some(9));
        // A missing field falls back to its mapping.
        assert_eq!(idx.line_of("keys[1].plan"), Some(8));
        assert_eq!(idx.line_of("nowhere"), None);
    }
}
