//! The docs name only what exists. Every backticked span of README.md, docs/**/*.md,
//! deploy/**/*.md and the comments of deploy/docker/Dockerfile is read for four kinds of name,
//! each checked against the thing itself rather than against a list kept here:
//!
//! | class | looks like | must be |
//! |---|---|---|
//! | metric | `tollgate_…` (histogram suffixes `_bucket`, `_sum`, `_count`; `tollgate_x_*` a prefix) | registered in src/ (a string literal `"tollgate_…"`); a running gateway's /metrics is held to the same list |
//! | flag | `--name` | a flag of the tollgate subcommand the span starts with (clap's own `Command`, Pingora's flags included); a span of flags alone: a flag of some subcommand, or one the repository's own scripts, benches and tests pass or parse. A span that starts with another command (`cargo build --release`) is that command's business |
//! | config field | `name:`, `multi_word: value`, `section.field`, `plans.<name>.shadow`, `keys[3].plan` | a field of the config file as serde reads it (the `File…` structs of crates/core/src/config/file.rs; Pingora's own keys also pass the `name: value` form) |
//! | path | starts with a top-level directory (`src/`, `deploy/`, …), or ends in a source or config extension | exists, from the repository root or the doc's own directory; a path under a directory that is not top-level (`runtime/live.rs`) may be any path's tail; a bare file name any file's name, or one the project's tools write |
//!
//! Fenced code blocks are not read. Every offender is printed with file:line.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;
use serde::de::DeserializeOwned;
use tollgate::config::file::{
    FileAuthFailures, FileCatalogue, FileCluster, FileConfig, FileKey, FileLedger, FileLimits,
    FileLog, FilePartner, FilePlan, FilePrevious, FileQuota, FileRoute, FileServer, FileShutdown,
    FileState, FileTls, FileTracing, FileUpstream, FileWebhookGuard,
};

use crate::harness::{metrics_page, Gateway, Mode, Upstream};

/// Top-level directories of the repository: a token starting with one is a repository path.
const TOP_DIRS: &[&str] = &[
    "src/",
    "crates/",
    "scripts/",
    "docs/",
    "deploy/",
    "policies/",
    "benches/",
    "tests/",
    "fuzz/",
    ".ci/",
];

/// Extensions that make a token a file name.
const FILE_EXTS: &[&str] = &[
    ".md", ".sh", ".yaml", ".yml", ".rs", ".lua", ".py", ".json", ".toml",
];

/// A last segment that makes `a.b` a file name rather than `section.field`.
const NOT_FIELDS: &[&str] = &[
    "db", "rs", "yaml", "yml", "md", "sh", "json", "toml", "lua", "html", "py", "txt", "log",
    "csv", "png", "pem", "crt", "sock", "pid", "conf", "service", "env", "lock",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ------------------------------------------------------------------------------------------
// What exists

/// A block of the config file (or the route catalogue): its fields as serde reads them.
struct Block {
    /// Where it sits: `` for the file's root, `plans.*`, `tls`, …; `routes file` for the
    /// catalogue's root.
    at: &'static str,
    type_name: &'static str,
    fields: BTreeSet<String>,
}

/// The field names serde accepts for `T` (a struct with `deny_unknown_fields`): its "unknown
/// field" error lists them, with every rename applied.
fn serde_fields<T: DeserializeOwned>(type_name: &str) -> BTreeSet<String> {
    let err = match serde_yaml::from_str::<T>("zz_docnames_probe: 0") {
        Ok(_) => panic!("{type_name} accepts an unknown field: give it deny_unknown_fields"),
        Err(e) => e.to_string(),
    };
    let Some((_, expected)) = err.split_once("unknown field `zz_docnames_probe`, expected ") else {
        panic!("{type_name}: not serde's unknown-field error: {err}");
    };
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

macro_rules! blocks {
    ($($at:literal => $t:ty),* $(,)?) => {
        vec![$(Block { at: $at, type_name: stringify!($t), fields: serde_fields::<$t>(stringify!($t)) }),*]
    };
}

/// Every block of the config file and of the route catalogue. A new `File…` struct must be
/// added here: `every_config_struct_is_in_the_vocabulary` fails until it is.
fn config_blocks() -> Vec<Block> {
    blocks![
        "" => FileConfig,
        "tls" => FileTls,
        "upstream" => FileUpstream,
        "limits" => FileLimits,
        "plans.*" => FilePlan,
        "keys" => FileKey,
        "keys.previous" => FilePrevious,
        "keys.quota" => FileQuota,
        "plans.*.quota" => FileQuota,
        "partner_quota" => FileQuota,
        "ledger" => FileLedger,
        "partners" => FilePartner,
        "log" => FileLog,
        "shutdown" => FileShutdown,
        "server" => FileServer,
        "auth_failures" => FileAuthFailures,
        "webhook_guard" => FileWebhookGuard,
        "cluster" => FileCluster,
        "state" => FileState,
        "tracing" => FileTracing,
        "routes file" => FileCatalogue,
        "routes file: routes" => FileRoute,
    ]
}

/// A top-level block of the config file: its fields, and whether entries come under names of
/// the operator's choosing (`plans.<name>.…`).
struct Section {
    fields: BTreeSet<String>,
    by_name: bool,
}

pub(crate) struct Vocab {
    metrics: BTreeSet<String>,
    /// `--flag`s by subcommand; `""` is the top level.
    flags: BTreeMap<String, BTreeSet<String>>,
    /// The repository's own scripts, benches, tests and sources (no doc): flags of other tools
    /// it uses, and files it writes.
    tool_text: String,
    /// Every field name of every block.
    fields: BTreeSet<String>,
    sections: BTreeMap<String, Section>,
    /// Keys of Pingora's own YAML (`--conf`).
    pingora_keys: BTreeSet<String>,
    /// Files and directories, relative to the root, `/`-separated.
    paths: BTreeSet<String>,
    dir_names: BTreeSet<String>,
    file_names: BTreeSet<String>,
}

/// Files and directories under `dir`, relative to it (no target/ or .git/).
fn walk(dir: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut files, mut dirs) = (BTreeSet::new(), BTreeSet::new());
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if path.is_dir() {
                if name != "target" && name != ".git" && name != "node_modules" {
                    dirs.insert(rel);
                    todo.push(path);
                }
            } else {
                files.insert(rel);
            }
        }
    }
    (files, dirs)
}

/// The metric names src/ registers: each is a string literal `"tollgate_…"` there.
fn registered_metrics() -> BTreeSet<String> {
    let (files, _) = walk(&repo().join("src"));
    let mut out = BTreeSet::new();
    for f in files.iter().filter(|f| f.ends_with(".rs")) {
        let text = fs::read_to_string(repo().join("src").join(f)).unwrap();
        for (i, _) in text.match_indices("\"tollgate_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if text[i + 1 + name.len()..].starts_with('"') {
                out.insert(name);
            }
        }
    }
    out
}

/// `--flag`s of every tollgate subcommand, from clap's own description of the command line.
fn cli_flags() -> BTreeMap<String, BTreeSet<String>> {
    let cmd = tollgate::cli::Cli::command();
    let longs = |c: &clap::Command| -> BTreeSet<String> {
        let mut set: BTreeSet<String> = c
            .get_arguments()
            .flat_map(|a| {
                a.get_long()
                    .into_iter()
                    .chain(a.get_all_aliases().unwrap_or_default())
            })
            .map(|l| format!("--{l}"))
            .collect();
        set.insert("--help".into());
        set
    };
    let mut out = BTreeMap::new();
    let mut top = longs(&cmd);
    top.insert("--version".into());
    out.insert(String::new(), top);
    for sub in cmd.get_subcommands() {
        out.insert(sub.get_name().to_string(), longs(sub));
    }
    out
}

impl Vocab {
    pub(crate) fn load() -> Self {
        let root = repo();
        let (files, dirs) = walk(&root);
        let doc_sources: BTreeSet<String> = doc_files().into_iter().collect();
        let mut tool_text = String::new();
        for f in &files {
            let skip = f.ends_with(".md")
                || doc_sources.contains(f)
                || f == "tests/it/docnames.rs"
                || f.ends_with("Cargo.lock");
            if skip {
                continue;
            }
            let path = root.join(f);
            if fs::metadata(&path).map_or(true, |m| m.len() > 2_000_000) {
                continue;
            }
            if let Ok(text) = fs::read_to_string(&path) {
                tool_text.push_str(&text);
                tool_text.push('\n');
            }
        }

        let blocks = config_blocks();
        let fields = blocks.iter().flat_map(|b| b.fields.clone()).collect();
        let root_fields = &blocks.iter().find(|b| b.at.is_empty()).unwrap().fields;
        let mut sections = BTreeMap::new();
        for b in &blocks {
            // Nested blocks (`keys.previous`) add their fields to the vocabulary, not sections.
            let nested = b.at.contains('.') && !b.at.ends_with(".*");
            if b.at.is_empty() || b.at.starts_with("routes file") || nested {
                continue;
            }
            let (name, by_name) = match b.at.strip_suffix(".*") {
                Some(n) => (n, true),
                None => (b.at, false),
            };
            assert!(
                root_fields.contains(name),
                "{}: `{name}` is not a top-level field",
                b.type_name
            );
            sections.insert(
                name.to_string(),
                Section {
                    fields: b.fields.clone(),
                    by_name,
                },
            );
        }

        let pingora =
            serde_yaml::to_value(pingora::server::configuration::ServerConf::default()).unwrap();
        let pingora_keys = pingora
            .as_mapping()
            .unwrap()
            .keys()
            .filter_map(|k| k.as_str().map(str::to_string))
            .collect();

        let dir_names = dirs.iter().map(|d| last_segment(d).to_string()).collect();
        let file_names = files.iter().map(|f| last_segment(f).to_string()).collect();
        let mut paths = files;
        paths.extend(dirs);
        Self {
            metrics: registered_metrics(),
            flags: cli_flags(),
            tool_text,
            fields,
            sections,
            pingora_keys,
            paths,
            dir_names,
            file_names,
        }
    }

    fn all_flags(&self) -> impl Iterator<Item = &String> {
        self.flags.values().flatten()
    }

    /// Whether `word` occurs in the tools' text as a whole word (not inside a longer name).
    fn tools_use(&self, word: &str) -> bool {
        let word_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        self.tool_text.match_indices(word).any(|(i, _)| {
            let before = self.tool_text[..i].chars().next_back();
            let after = self.tool_text[i + word.len()..].chars().next();
            !before.is_some_and(|c| word_char(c) || c == '.') && !after.is_some_and(word_char)
        })
    }
}

fn last_segment(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

// ------------------------------------------------------------------------------------------
// The docs

/// The docs read, relative to the root.
fn doc_files() -> Vec<String> {
    let root = repo();
    let mut out = vec!["README.md".to_string()];
    for dir in ["docs", "deploy"] {
        let (files, _) = walk(&root.join(dir));
        out.extend(
            files
                .into_iter()
                .filter(|f| f.ends_with(".md"))
                .map(|f| format!("{dir}/{f}")),
        );
    }
    out.push("deploy/docker/Dockerfile".to_string());
    out
}

/// The text of a doc as Markdown: a Dockerfile contributes its comments only, on their lines.
fn doc_text(rel: &str) -> String {
    let text = fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    if rel.ends_with(".md") {
        return text;
    }
    text.lines()
        .map(|l| l.trim_start().strip_prefix('#').unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The backticked spans of Markdown `text`, with the line each starts on. Fenced blocks are
/// skipped; a span may continue over a line break within its paragraph; a run of n backticks
/// closes at the next run of n.
fn spans(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut para: Vec<(usize, &str)> = Vec::new();
    let mut fenced = false;
    let flush = |para: &mut Vec<(usize, &str)>, out: &mut Vec<(usize, String)>| {
        let mut joined = String::new();
        let mut line_at = Vec::new(); // (byte offset, line number)
        for (n, l) in para.drain(..) {
            line_at.push((joined.len(), n));
            joined.push_str(l);
            joined.push('\n');
        }
        let line_of = |off: usize| {
            line_at
                .iter()
                .rev()
                .find(|(o, _)| *o <= off)
                .map_or(0, |(_, n)| *n)
        };
        let b = joined.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'`' {
                i += 1;
                continue;
            }
            let run = b[i..].iter().take_while(|c| **c == b'`').count();
            let start = i + run;
            let mut j = start;
            let mut close = None;
            while j < b.len() {
                if b[j] == b'`' {
                    let r = b[j..].iter().take_while(|c| **c == b'`').count();
                    if r == run {
                        close = Some(j);
                        break;
                    }
                    j += r;
                } else {
                    j += 1;
                }
            }
            match close {
                Some(c) => {
                    let content = joined[start..c].replace('\n', " ");
                    out.push((line_of(i), content.trim().to_string()));
                    i = c + run;
                }
                None => i = start,
            }
        }
    };
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            flush(&mut para, &mut out);
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if t.is_empty() {
            flush(&mut para, &mut out);
        } else {
            para.push((n + 1, line));
        }
    }
    flush(&mut para, &mut out);
    out
}

// ------------------------------------------------------------------------------------------
// The checks

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Offender {
    doc: String,
    line: usize,
    class: &'static str,
    name: String,
    why: String,
}

impl fmt::Display for Offender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {} `{}`: {}",
            self.doc, self.line, self.class, self.name, self.why
        )
    }
}

/// Everything wrong with the names in `text` (the doc `doc`, relative to the root).
pub(crate) fn check(doc: &str, text: &str, v: &Vocab) -> Vec<Offender> {
    let mut out = BTreeSet::new();
    let doc_dir = doc.rsplit_once('/').map_or("", |(d, _)| d);
    for (line, span) in spans(text) {
        let mut bad = |class: &'static str, name: &str, why: String| {
            out.insert(Offender {
                doc: doc.to_string(),
                line,
                class,
                name: name.to_string(),
                why,
            });
        };
        for (name, why) in check_metrics(&span, v) {
            bad("metric", &name, why);
        }
        for (name, why) in check_flags(&span, v) {
            bad("flag", &name, why);
        }
        for (name, why) in check_fields(&span, v) {
            bad("config field", &name, why);
        }
        for (name, why) in check_paths(&span, doc_dir, v) {
            bad("path", &name, why);
        }
    }
    out.into_iter().collect()
}

fn check_metrics(span: &str, v: &Vocab) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let b = span.as_bytes();
    for (i, _) in span.match_indices("tollgate_") {
        if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') {
            continue;
        }
        let name: String = span[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '*')
            .collect();
        let rest = &span[i + name.len()..];
        if name == "tollgate_" || rest.starts_with("::") {
            continue; // a prefix in prose (`tollgate_…`), or a Rust path
        }
        let known = |n: &str| v.metrics.contains(n);
        let ok = match name.strip_suffix('*') {
            Some(prefix) => v.metrics.iter().any(|m| m.starts_with(prefix)),
            None => {
                known(&name)
                    || ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| name.strip_suffix(s).is_some_and(known))
            }
        };
        if !ok {
            out.push((
                name,
                "the gateway registers no such metric (src/runtime/metrics.rs, src/shared/metrics.rs)"
                    .to_string(),
            ));
        }
    }
    out
}

fn trim_token(t: &str) -> &str {
    t.trim_matches(|c: char| matches!(c, '[' | ']' | '(' | ')' | ',' | ';' | '"' | '\'' | '`'))
}

fn check_flags(span: &str, v: &Vocab) -> Vec<(String, String)> {
    let tokens: Vec<&str> = span.split_whitespace().map(trim_token).collect();
    let flags: Vec<&str> = tokens
        .iter()
        .filter(|t| t.starts_with("--") && t[2..].starts_with(|c: char| c.is_ascii_alphabetic()))
        .map(|t| t.split('=').next().unwrap())
        .collect();
    if flags.is_empty() {
        return Vec::new();
    }
    // The command the span starts with, past environment assignments and sudo.
    let mut words = tokens.iter().skip_while(|t| {
        **t == "sudo"
            || t.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty()
                    && k.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            })
    });
    let first = *words.next().unwrap_or(&"");
    let scope: Option<&str> = if first.starts_with("--") {
        None
    } else if first == "tollgate" || first.ends_with("/tollgate") {
        Some(
            words
                .next()
                .filter(|w| v.flags.contains_key(**w))
                .copied()
                .unwrap_or(""),
        )
    } else if v.flags.contains_key(first) && !first.is_empty() {
        Some(first)
    } else {
        return Vec::new(); // another command's flags
    };
    let mut out = Vec::new();
    for flag in flags {
        match scope {
            Some(sub) => {
                if !v.flags[sub].contains(flag) {
                    let whose = if sub.is_empty() {
                        "tollgate".to_string()
                    } else {
                        format!("tollgate {sub}")
                    };
                    out.push((flag.to_string(), format!("`{whose}` has no such flag")));
                }
            }
            None => {
                if !v.all_flags().any(|f| f == flag) && !v.tools_use(flag) {
                    out.push((
                        flag.to_string(),
                        "no tollgate subcommand takes it, and no script, bench or test of the \
                         repository uses it (name the command in the span for another tool's flag)"
                            .to_string(),
                    ));
                }
            }
        }
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn check_fields(span: &str, v: &Vocab) -> Vec<(String, String)> {
    let mut out = Vec::new();
    // `name:` alone: a block or field of the config file (or of the route catalogue).
    if let Some(name) = span.strip_suffix(':') {
        if is_ident(name) && !v.fields.contains(name) {
            out.push((
                span.to_string(),
                "no block of the config file has such a field (crates/core/src/config/file.rs)"
                    .to_string(),
            ));
        }
    }
    // `multi_word: value`: a config line; Pingora's --conf keys too.
    if let Some((name, value)) = span.split_once(": ") {
        if is_ident(name)
            && name.contains('_')
            && !value.trim().is_empty()
            && !v.fields.contains(name)
            && !v.pingora_keys.contains(name)
        {
            out.push((
                format!("{name}:"),
                "neither a field of the config file nor a key of Pingora's --conf".to_string(),
            ));
        }
    }
    // `section.field` (also `plans.<name>.field`, `keys[3].plan`).
    for token in span.split_whitespace() {
        let token = trim_token(token).trim_end_matches([':', '.']);
        let segments: Vec<String> = token
            .split('.')
            .map(|s| match s.find('[') {
                Some(i)
                    if s.ends_with(']')
                        && s[i + 1..s.len() - 1].chars().all(|c| c.is_ascii_digit()) =>
                {
                    s[..i].to_string()
                }
                _ => s.to_string(),
            })
            .collect();
        if segments.len() < 2
            || !segments
                .iter()
                .all(|s| is_ident(s) || (s.starts_with('<') && s.ends_with('>') && s.len() > 2))
            || NOT_FIELDS.contains(&segments.last().unwrap().as_str())
        {
            continue;
        }
        let Some(section) = v.sections.get(&segments[0]) else {
            continue; // not a config path (`config.keys`, `budget.lua`)
        };
        let mut rest = &segments[1..];
        if section.by_name {
            rest = &rest[1..]; // the operator's name for the entry
        }
        let why = match rest {
            [] => None,
            [field] if section.fields.contains(field) => None,
            [field] => Some(format!("`{}` has no field `{field}`", segments[0])),
            [field, ..] => Some(format!("`{}.{field}` has no fields below it", segments[0])),
        };
        if let Some(why) = why {
            out.push((token.to_string(), why));
        }
    }
    out
}

/// Whether git says `path` is generated output (matched by a .gitignore), as a file or a
/// directory.
fn git_ignored(path: &str) -> bool {
    [path.to_string(), format!("{}/", path.trim_end_matches('/'))]
        .iter()
        .any(|p| {
            Command::new("git")
                .args(["check-ignore", "-q", "--no-index", p])
                .current_dir(repo())
                .status()
                .is_ok_and(|s| s.success())
        })
}

fn check_paths(span: &str, doc_dir: &str, v: &Vocab) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for token in span.split_whitespace() {
        let mut t = trim_token(token);
        if t.is_empty()
            || t.contains("://")
            || t.starts_with(['/', '~', '$', '-', '.'])
                && !t.starts_with("./")
                && !t.starts_with(".ci/")
            || t.contains(['*', '{', '}', '<', '>', '…', '$', '=', '|', '%'])
        {
            continue;
        }
        // `file.rs:42`, `file.md#anchor`
        if let Some((p, n)) = t.rsplit_once(':') {
            if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit() || c == '-') {
                t = p;
            }
        }
        t = t.split('#').next().unwrap();
        t = t.strip_prefix("./").unwrap_or(t);
        let path = t.trim_end_matches('/');
        if path.is_empty() {
            continue;
        }
        let top = TOP_DIRS.iter().any(|d| t.starts_with(d));
        let file_like = FILE_EXTS.iter().any(|e| path.ends_with(e));
        let here = |p: &str| {
            v.paths.contains(p)
                || (!doc_dir.is_empty() && v.paths.contains(&format!("{doc_dir}/{p}")))
        };
        let why = if top {
            (!here(path) && !git_ignored(path))
                .then(|| "no such file or directory in the repository".to_string())
        } else if t.contains('/') {
            // Under a directory that is not top-level (`runtime/live.rs`, `k8s/`): some path's tail.
            let first = path.split('/').next().unwrap();
            if !(file_like || t.ends_with('/')) || !v.dir_names.contains(first) {
                continue; // not a path of this repository (`h2/src/…`, `limit/acquire`)
            }
            let tail = format!("/{path}");
            (!here(path) && !v.paths.iter().any(|p| p.ends_with(&tail)))
                .then(|| "no path of the repository ends so".to_string())
        } else if file_like {
            (!v.file_names.contains(path) && !v.tools_use(path)).then(|| {
                "no file of the repository has this name, and no tool of it writes one".to_string()
            })
        } else {
            continue;
        };
        if let Some(why) = why {
            out.push((path.to_string(), why));
        }
    }
    out
}

// ------------------------------------------------------------------------------------------
// Tests

#[test]
fn the_docs_name_only_metrics_flags_fields_and_paths_that_exist() {
    let v = Vocab::load();
    let mut offenders = Vec::new();
    for doc in doc_files() {
        offenders.extend(check(&doc, &doc_text(&doc), &v));
    }
    for o in &offenders {
        println!("{o}");
    }
    assert!(
        offenders.is_empty(),
        "{} name(s) in the docs that do not exist:\n{}",
        offenders.len(),
        offenders
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn the_checker_reports_a_bogus_metric_flag_field_and_path() {
    let v = Vocab::load();
    let doc = "\
Real: `tollgate_requests_total{outcome=\"forwarded\"}`, `tollgate_request_duration_seconds_bucket`,
`tollgate_cluster_*`, `tollgate run --config FILE --upgrade`, `top --once`, `--allow-demo-keys`,
`cargo build --release --locked`, `redis-server --port 6379`, `--sanitizer none`, `cluster:`,
`drain_seconds: 10`, `threads: 1`, `cluster.redis_url`, `plans.<name>.shadow`, `keys[3].plan`,
`state.db`, `config.keys`, `deploy/README.md`, `k8s/redis.yaml`, `runtime/live.rs`,
`h2/src/codec/framed_write.rs`, `budget.lua`, `summary.md`, `fuzz/corpus`, `limit/acquire`.

```sh
tollgate run --no-such-flag  # fenced: not read
```

Bogus: `tollgate_requests_totl`, `tollgate_clustr_*`, `tollgate check --confg FILE`,
`--allow-demo-key`, `clustr:`, `max_conections: 10000`, `cluster.redis_urll`,
`plans.basic.shadoww`, `src/admin/guardd.rs`, `deploy/k8s/secrets.yaml`,
`runtime/lives.rs`, `gatway.yaml`.
";
    let found: Vec<(usize, &str, String)> = check("deploy/README.md", doc, &v)
        .into_iter()
        .map(|o| (o.line, o.class, o.name))
        .collect();
    let want: Vec<(usize, &str, String)> = [
        (12, "metric", "tollgate_clustr_*"),
        (12, "metric", "tollgate_requests_totl"),
        (12, "flag", "--confg"),
        (13, "flag", "--allow-demo-key"),
        (13, "config field", "clustr:"),
        (13, "config field", "max_conections:"),
        (13, "config field", "cluster.redis_urll"),
        (14, "config field", "plans.basic.shadoww"),
        (14, "path", "src/admin/guardd.rs"),
        (14, "path", "deploy/k8s/secrets.yaml"),
        (15, "path", "runtime/lives.rs"),
        (15, "path", "gatway.yaml"),
    ]
    .into_iter()
    .map(|(l, c, n)| (l, c, n.to_string()))
    .collect();
    let mut sorted_want = want.clone();
    sorted_want.sort();
    let mut sorted_found = found.clone();
    sorted_found.sort();
    assert_eq!(sorted_found, sorted_want);
}

#[test]
fn spans_are_read_across_line_breaks_and_not_in_fences() {
    let text =
        "a `one` b `two\nlines` c\n\n```\n`fenced`\n```\nd ``x ` y`` e `unclosed\n\nf `last`\n";
    assert_eq!(
        spans(text),
        [
            (1, "one".to_string()),
            (1, "two lines".to_string()),
            (7, "x ` y".to_string()),
            (9, "last".to_string()),
        ]
    );
}

#[test]
fn every_config_struct_is_in_the_vocabulary() {
    // Every struct of the file format that serde reads, as the source declares them.
    let src = fs::read_to_string(repo().join("crates/core/src/config/file.rs")).unwrap();
    let mut declared = BTreeSet::new();
    let mut derives_deserialize = false;
    for line in src.lines() {
        let line = line.trim();
        if line.starts_with("#[derive(") {
            derives_deserialize = line.contains("Deserialize");
        } else if let Some(rest) = line.strip_prefix("pub struct ") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if derives_deserialize {
                declared.insert(name);
            }
            derives_deserialize = false;
        }
    }
    let listed: BTreeSet<String> = config_blocks()
        .iter()
        .map(|b| b.type_name.to_string())
        .collect();
    assert_eq!(
        declared, listed,
        "config_blocks() in tests/it/docnames.rs must list every struct of the file format"
    );
    // And the top level's blocks are all there.
    let v = Vocab::load();
    for s in [
        "cluster", "server", "plans", "keys", "state", "upstream", "limits",
    ] {
        assert!(v.sections.contains_key(s), "{s}");
    }
    assert!(v.fields.contains("admin_token_sha256") && v.fields.contains("redis_url_env"));
}

#[test]
fn the_flags_come_from_the_command_line_itself() {
    let v = Vocab::load();
    for (sub, flag) in [
        ("run", "--config"),
        ("run", "--allow-demo-keys"),
        ("run", "--upgrade"),
        ("run", "--conf"),
        ("top", "--admin"),
        ("top", "--once"),
        ("demo", "--admin-port"),
        ("", "--version"),
    ] {
        assert!(v.flags[sub].contains(flag), "tollgate {sub} {flag}");
    }
}

#[test]
fn a_running_gateway_exports_only_the_metrics_the_source_registers() {
    // The doc check reads the names from the source; a live /metrics page (after one request,
    // so that labelled series exist) must not show a name that reading missed.
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    assert_eq!(
        gw.call("not-a-key", "GET", "/v2/getSettings/", "").status,
        401
    );
    let page = metrics_page(gw.config.process.admin_listen);
    let exported: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    let registered = registered_metrics();
    assert!(
        exported.len() >= 8,
        "too few metrics on the page: {exported:?}"
    );
    let missed: Vec<_> = exported.difference(&registered).collect();
    assert!(
        missed.is_empty(),
        "exported but not found in the source: {missed:?}"
    );
}
