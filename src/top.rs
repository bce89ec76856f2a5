//! `tollgate top --admin URL`: the usage view in a terminal, refreshed every 2 s (ratatui), for
//! operators on a shell. It reads `/api/usage` of a running gateway's admin listener, as the
//! page does; the token, when the listener needs one, comes from `TOLLGATE_ADMIN_TOKEN` (not a
//! flag: a flag shows in `ps`). `--once` prints one frame as text and exits (for scripts).
//!
//! **Layout.** The screen is text lines made by [`screen`] for a given width and height, the
//! same for the live view and `--once`: a title line, the summary (its items wrapped, never
//! cut mid-item), then [`Section`]s: the busiest keys, the latest refusals. It is made for 80×24
//! and up:
//! - *Width.* A [`Table`] shows each column whole or not at all: when the columns do not fit,
//!   the least important goes first (each column's `drop` rank; the key name never goes). A
//!   header is never cut. Names (keys, plans, partners, routes) are cut with `…` only when the
//!   room left for them is shorter than the name, and a key name keeps at least
//!   [`KEY_NAME_ROOM`] characters: at 80 columns the table drops columns before it cuts a name
//!   shorter than that.
//! - *Height.* Sections share the rows left under the summary ([`share`]): each first gets its
//!   `keep` rows, then the rest goes to them in order (the keys first); rows that do not fit
//!   are summarised on one line, `… N more keys`. Blank lines between sections only when rows
//!   are left over.
//!
//! A section for something new (blocked addresses, say) is one more [`Section`] in the list
//! [`screen`] builds, after the keys: its title, a [`Table`] of its columns, what its rows are
//! called and how many to keep; the sharing and the width rules apply to it as they are.
//!
//! `--once` prints the lines and nothing else: no padding to a screen's height, no trailing
//! blank line, no escape sequence (plain text, even on a terminal). On a terminal it is as wide
//! as the terminal; into a pipe or a file it has no width limit (every column, every name whole),
//! and it always holds every row the view has.
//!
//! Widths are counted in characters: names in a config are ASCII (1–64 of `A–Z a–z 0–9 _ - .`);
//! control characters in what the listener sends are shown as `?`.

use std::io::{IsTerminal, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::admin::view::UsageView;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Text};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

/// Where the admin listener is, and its token.
pub(crate) struct Admin {
    host: String,
    port: u16,
    token: Option<String>,
}

impl Admin {
    /// `http://host:port` (https is not served by the admin listener).
    pub(crate) fn parse(url: &str, token: Option<String>) -> Result<Self, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url}: the admin listener is http://host:port"))?;
        let hostport = rest.trim_end_matches('/');
        let (host, port) = hostport
            .rsplit_once(':')
            .ok_or_else(|| format!("{url}: no port"))?;
        let port = port.parse().map_err(|_| format!("{url}: bad port"))?;
        Ok(Self {
            host: host.trim_matches(['[', ']']).to_string(),
            port,
            token,
        })
    }

    /// `GET /api/usage`.
    pub(crate) fn usage(&self) -> Result<UsageView, String> {
        let mut s = TcpStream::connect((self.host.as_str(), self.port))
            .map_err(|e| format!("{}:{}: {e}", self.host, self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let auth = self
            .token
            .as_ref()
            .map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        write!(
            s,
            "GET /api/usage HTTP/1.1\r\nHost: {}\r\n{auth}Connection: close\r\n\r\n",
            self.host
        )
        .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        s.take(16 << 20).read_to_end(&mut raw).map_err(|e| {
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                format!("{}:{}: no answer within 5 s", self.host, self.port)
            } else {
                format!("{}:{}: {e}", self.host, self.port)
            }
        })?;
        let at = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("an answer without a head")?;
        let head = String::from_utf8_lossy(&raw[..at]);
        let status = head.split(' ').nth(1).unwrap_or("?");
        if status != "200" {
            let why = match (status, &self.token) {
                ("401", None) => " (TOLLGATE_ADMIN_TOKEN is not set)",
                ("401", Some(_)) => " (the token in TOLLGATE_ADMIN_TOKEN was refused)",
                _ => "",
            };
            return Err(format!("/api/usage answered {status}{why}"));
        }
        serde_json::from_slice(&raw[at + 4..]).map_err(|e| {
            format!(
                "/api/usage: {e} (is {}:{} the admin listener?)",
                self.host, self.port
            )
        })
    }
}

/// Run the live view until `q` (or Esc, or Ctrl-C).
pub(crate) fn run(admin: &Admin) -> Result<(), String> {
    if !std::io::stdout().is_terminal() {
        return Err("the live view needs a terminal: use --once to print one frame".into());
    }
    let mut terminal = ratatui::try_init().map_err(|e| e.to_string())?;
    let result = (|| {
        let mut last: Result<UsageView, String> = admin.usage();
        let mut fetched = Instant::now();
        loop {
            terminal
                .draw(|f| draw(f, &last))
                .map_err(|e| e.to_string())?;
            if event::poll(Duration::from_millis(200)).map_err(|e| e.to_string())? {
                if let Event::Key(k) = event::read().map_err(|e| e.to_string())? {
                    let ctrl_c = k.code == KeyCode::Char('c')
                        && k.modifiers.contains(event::KeyModifiers::CONTROL);
                    if k.kind == KeyEventKind::Press
                        && (matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c)
                    {
                        return Ok(());
                    }
                }
            }
            if fetched.elapsed() >= Duration::from_secs(2) {
                last = admin.usage();
                fetched = Instant::now();
            }
        }
    })();
    ratatui::restore();
    result
}

/// One frame, as text (`--once`): as wide as the terminal when stdout is one, else without a
/// width limit; every row (see the module's docs).
pub(crate) fn once(admin: &Admin) -> Result<String, String> {
    let usage = admin.usage()?;
    let width = if std::io::stdout().is_terminal() {
        ratatui::crossterm::terminal::size()
            .ok()
            .map(|(w, _)| usize::from(w))
            .filter(|&w| w > 0)
    } else {
        None
    };
    Ok(once_text(&usage, width))
}

/// The text `--once` prints for `usage`, `width` characters wide at most (`None`: no limit):
/// the lines of [`screen`] with no height limit, each ended by a newline, none blank at the end.
pub(crate) fn once_text(usage: &UsageView, width: Option<usize>) -> String {
    let lines = screen(&Ok(usage.clone()), Mode::Once, width, None);
    let mut out = String::new();
    for l in &lines {
        out.push_str(l.text.trim_end());
        out.push('\n');
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// The live view's frame: [`screen`] at the terminal's size.
fn draw(f: &mut Frame<'_>, usage: &Result<UsageView, String>) {
    let area = f.area();
    let lines = screen(
        usage,
        Mode::Live,
        Some(usize::from(area.width)),
        Some(usize::from(area.height)),
    );
    let text: Vec<Line<'_>> = lines
        .into_iter()
        .map(|l| Line::styled(l.text, l.look.style()))
        .collect();
    f.render_widget(Paragraph::new(Text::from(text)), area);
}

/// Which view a screen is for: its title says how it refreshes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `tollgate top`: refreshed every 2 s, `q` quits.
    Live,
    /// `tollgate top --once`.
    Once,
}

/// How the live view shows a line (`--once` prints the text alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Look {
    /// The first line.
    Title,
    /// A section's title.
    Section,
    /// A table's header.
    Header,
    /// `… N more keys`, or a section with nothing in it.
    Note,
    Plain,
}

impl Look {
    fn style(self) -> Style {
        match self {
            Look::Title => Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED),
            Look::Section => Style::default().add_modifier(Modifier::BOLD),
            Look::Header => Style::default().add_modifier(Modifier::UNDERLINED),
            Look::Note => Style::default().add_modifier(Modifier::DIM),
            Look::Plain => Style::default(),
        }
    }
}

/// One line of the screen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScreenLine {
    pub text: String,
    pub look: Look,
}

impl ScreenLine {
    fn new(text: impl Into<String>, look: Look) -> Self {
        Self {
            text: text.into(),
            look,
        }
    }
}

/// Characters a key name keeps at least before the keys table cuts it (with `…`): the table
/// drops columns first.
pub(crate) const KEY_NAME_ROOM: usize = 16;
/// Spaces between two columns.
const GAP: usize = 2;

/// The screen for `usage`: at most `width` characters a line and `height` lines (`None`: no
/// limit). See the module's docs for the layout.
pub(crate) fn screen(
    usage: &Result<UsageView, String>,
    mode: Mode,
    width: Option<usize>,
    height: Option<usize>,
) -> Vec<ScreenLine> {
    let mut lines = Vec::new();
    let suffix = match mode {
        Mode::Live => " · refreshed every 2 s · q quits",
        Mode::Once => "",
    };
    match usage {
        Err(e) => {
            lines.push(ScreenLine::new(format!("Tollgate{suffix}"), Look::Title));
            let why = clean(&format!("tollgate top: {e}"));
            let words: Vec<String> = why.split_whitespace().map(String::from).collect();
            for l in wrap(&words, " ", width) {
                lines.push(ScreenLine::new(l, Look::Plain));
            }
        }
        Ok(u) => {
            let at = hms(u.generated_at_ms);
            lines.push(ScreenLine::new(
                format!("Tollgate · {at} UTC{suffix}"),
                Look::Title,
            ));
            for l in wrap(&summary(u), " · ", width) {
                lines.push(ScreenLine::new(l, Look::Plain));
            }
            if let Some(l) = sparkline(u, width) {
                lines.push(ScreenLine::new(l, Look::Plain));
            }
            // Below the keys, in the order they are shown; blocked addresses only when some
            // are.
            let mut sections = vec![keys_section(u)];
            if !u.blocks.is_empty() {
                sections.push(blocks_section(u));
            }
            if !u.key_changes.is_empty() {
                sections.push(changes_section(u));
            }
            sections.push(refusals_section(u, mode));
            let room = height.map(|h| h.saturating_sub(lines.len()));
            let given = match room {
                Some(room) => share(&sections, room),
                None => sections.iter().map(Section::want).collect(),
            };
            let used: usize = given.iter().sum();
            let spare = room.is_none_or(|r| r - used >= sections.len());
            for (s, n) in sections.iter().zip(given) {
                if n == 0 {
                    continue;
                }
                if spare {
                    lines.push(ScreenLine::new("", Look::Plain));
                }
                lines.extend(s.render(width, n));
            }
        }
    }
    // Bounds kept whatever the content (a terminal narrower than the layout is made for).
    if let Some(w) = width {
        for l in &mut lines {
            l.text = fit(&l.text, w);
        }
    }
    if let Some(h) = height {
        lines.truncate(h);
    }
    lines
}

/// The summary's items: config, counts, reload, cluster.
fn summary(u: &UsageView) -> Vec<String> {
    let c = &u.config;
    let reload = match &c.last_reload {
        None => "no reload since start".to_string(),
        Some(r) => format!("last reload: {} at {} UTC", clean(&r.result), hms(r.at_ms)),
    };
    let cluster = match &u.cluster {
        None => "budgets: this process".to_string(),
        Some(cl) => format!(
            "cluster: store {}, {} replicas",
            if cl.store_up {
                "up"
            } else {
                "DOWN (limit / N)"
            },
            cl.replicas
        ),
    };
    vec![
        format!("config {}", clean(&c.file)),
        format!("{} keys", c.keys),
        format!("{} partners", c.partners),
        format!("{} plans", c.plans.len()),
        format!("{} s window", c.window_seconds),
        reload,
        cluster,
        format!("{} overrides", u.overrides.len()),
        format!("{} requests without a key (1 min)", u.anonymous_requests),
    ]
}

/// The timeline of the last 10 minutes as one line: requests per 10 s, a block per point
/// (the most recent last; as many as the width allows), then the peak and what was refused.
fn sparkline(u: &UsageView, width: Option<usize>) -> Option<String> {
    const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if u.timeline.is_empty() {
        return None;
    }
    let totals: Vec<u64> = u.timeline.iter().map(|p| p.counts.values().sum()).collect();
    let refused: u64 = u
        .timeline
        .iter()
        .flat_map(|p| p.counts.iter())
        .filter(|(o, _)| {
            !matches!(o.as_str(), "forwarded" | "upstream_error") && !o.starts_with("shadow_")
        })
        .map(|(_, n)| n)
        .sum();
    let peak = totals.iter().copied().max().unwrap_or(0);
    let label = "last 10 min ";
    let tail = format!(" busiest 10 s: {peak}, {refused} refused");
    let room = width.map_or(totals.len(), |w| {
        w.saturating_sub(label.len() + tail.len()).min(totals.len())
    });
    let spark: String = totals[totals.len() - room..]
        .iter()
        .map(|&n| match n {
            0 => ' ',
            n => BLOCKS[((n * 8 - 1) / peak.max(1)).min(7) as usize],
        })
        .collect();
    Some(format!("{label}{spark}{tail}"))
}

/// The busiest keys.
fn keys_section(u: &UsageView) -> Section {
    let k = &u.keys;
    let num = |f: &dyn Fn(&crate::admin::view::KeyRow) -> u64| -> Vec<String> {
        k.iter().map(|r| f(r).to_string()).collect()
    };
    // Shadow mode's count matters where a plan is in shadow mode; elsewhere it is 0.
    let shadow_drop = if u.config.plans.iter().any(|p| p.shadow) {
        2
    } else {
        9
    };
    let mut columns = vec![
        Column::text(
            "key",
            0,
            KEY_NAME_ROOM,
            k.iter().map(|r| match r.state.as_str() {
                "" | "active" => clean(&r.key),
                state => format!("{} ({})", clean(&r.key), clean(state)),
            }),
        ),
        Column::number("requests", 1, num(&|r| r.requests)),
        Column::number(
            "budget",
            2,
            k.iter()
                .map(|r| format!("{}/{}", r.budget_left, r.limit))
                .collect(),
        ),
        Column::number("limited", 3, num(&|r| r.refusals.rate_limited)),
        // The other refusals, by code, most first (`plan_restricted 2`): a 403 for the plan
        // and one for the credential are not the same problem.
        Column::text(
            "codes",
            4,
            16,
            k.iter().map(|r| {
                let mut c: Vec<(&String, &u64)> = r
                    .codes
                    .iter()
                    .filter(|(c, _)| *c != "rate_limited")
                    .collect();
                c.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                let shown: Vec<String> =
                    c.iter().map(|(c, n)| format!("{} {n}", clean(c))).collect();
                if shown.is_empty() {
                    "-".to_string()
                } else {
                    shown.join(", ")
                }
            }),
        ),
        Column::text(
            "plan",
            5,
            10,
            k.iter().map(|r| {
                let star = if r.overridden { "*" } else { "" };
                format!("{}{star}", clean(&r.plan))
            }),
        ),
        Column::number("admitted", 6, num(&|r| r.admitted)),
        Column::text(
            "partner",
            8,
            10,
            k.iter().map(|r| or_dash(r.partner.as_deref())),
        ),
        Column::number("shadowed", shadow_drop, num(&|r| r.shadowed)),
    ];
    if k.iter().any(|r| r.quota.is_some()) {
        // A quota's period: used of its requests (`1200/5000`), `-` without one; shown only
        // when a key has a quota.
        columns.push(Column::number(
            "quota",
            7,
            k.iter()
                .map(|r| {
                    r.quota
                        .as_ref()
                        .map_or("-".to_string(), |q| format!("{}/{}", q.used, q.requests))
                })
                .collect(),
        ));
    }
    Section {
        title: "Busiest keys, last minute".into(),
        notes: vec![
            "* partner override",
            "limited: 429 rate_limited; codes: the other refusals, by code; quota: used/quota this period",
        ],
        table: Table::new(
            columns,
            [
                "key", "plan", "partner", "requests", "admitted", "limited", "codes", "shadowed",
                "budget", "quota",
            ],
        ),
        noun: "keys",
        empty: "no request with a key in the last minute",
        keep: 5,
    }
}

/// The addresses auth-failure blocking holds now (`GET /api/blocks`), longest-held first.
fn blocks_section(u: &UsageView) -> Section {
    let b = &u.blocks;
    // `2026-11-25T19:43:30Z` → `19:43:30`: the view is of the last minutes.
    let time = |t: &str| t.get(11..19).unwrap_or(t).to_string();
    let columns = vec![
        Column::text("address", 0, 15, b.iter().map(|b| b.address.clone())),
        Column::number("until (UTC)", 1, b.iter().map(|b| time(&b.until)).collect()),
        Column::number(
            "failures",
            2,
            b.iter().map(|b| b.failures.to_string()).collect(),
        ),
        Column::text("listener", 3, 7, b.iter().map(|b| b.listener.clone())),
        Column::number("since (UTC)", 4, b.iter().map(|b| time(&b.since)).collect()),
    ];
    Section {
        title: "Blocked addresses".into(),
        notes: vec!["release: DELETE /api/blocks/{address}"],
        table: Table::new(
            columns,
            [
                "address",
                "listener",
                "failures",
                "since (UTC)",
                "until (UTC)",
            ],
        ),
        noun: "addresses",
        empty: "none",
        keep: 2,
    }
}

/// Keys changed live and keys past their expiry (`key_changes`), newest first.
fn changes_section(u: &UsageView) -> Section {
    let c = &u.key_changes;
    let time = |t: &str| t.get(..19).unwrap_or(t).replace('T', " ");
    let columns = vec![
        Column::text("key", 0, 12, c.iter().map(|c| c.key.clone())),
        Column::text("change", 1, 9, c.iter().map(|c| c.change.clone())),
        Column::text("by", 2, 8, c.iter().map(|c| c.by.clone())),
        Column::number("since (UTC)", 3, c.iter().map(|c| time(&c.since)).collect()),
        Column::text(
            "detail",
            4,
            6,
            c.iter().map(|c| or_dash(c.detail.as_deref())),
        ),
    ];
    Section {
        title: "Keys changed live".into(),
        notes: vec!["one key: GET /api/keys/{name}"],
        table: Table::new(columns, ["key", "change", "detail", "by", "since (UTC)"]),
        noun: "changes",
        empty: "none",
        keep: 2,
    }
}

/// The latest refusals, newest first: the ten newest live (a glance), every one the view
/// holds with `--once` (for scripts: every row).
fn refusals_section(u: &UsageView, mode: Mode) -> Section {
    let shown = match mode {
        Mode::Once => u.refusals.len(),
        Mode::Live => u.refusals.len().min(10),
    };
    let r = &u.refusals[..shown];
    let columns = vec![
        Column::number("time (UTC)", 0, r.iter().map(|r| hms(r.at_ms)).collect()),
        Column::text("key", 1, 12, r.iter().map(|r| or_dash(r.key.as_deref()))),
        Column::text(
            "code",
            2,
            12,
            r.iter().map(|r| {
                let status = r.status.map_or_else(|| "-".into(), |s| s.to_string());
                format!("{status} {}", or_dash(r.code.as_deref()))
            }),
        ),
        Column::text(
            "route",
            3,
            10,
            r.iter().map(|r| or_dash(r.route.as_deref())),
        ),
    ];
    Section {
        title: "Latest refusals".into(),
        notes: vec!["newest first"],
        table: Table::new(columns, ["time (UTC)", "key", "route", "code"]),
        noun: "refusals",
        empty: "none",
        keep: 3,
    }
}

/// A part of the screen below the summary: a title line, then its table's header and rows
/// (or `empty`, when it has no row).
pub(crate) struct Section {
    pub title: String,
    /// Said after the title, ` · ` apart, each only if it fits the width whole.
    pub notes: Vec<&'static str>,
    pub table: Table,
    /// What the rows are, for `… N more keys`.
    pub noun: &'static str,
    /// The line shown when there is no row.
    pub empty: &'static str,
    /// Rows it keeps when sections share a short screen ([`share`]).
    pub keep: usize,
}

impl Section {
    /// Lines for everything: title, header, rows.
    pub(crate) fn want(&self) -> usize {
        match self.table.rows() {
            0 => 2,
            n => 2 + n,
        }
    }

    /// Lines for its title, header and `keep` rows (and the line that counts the rest).
    pub(crate) fn least(&self) -> usize {
        match self.table.rows() {
            0 => 2,
            n if n <= self.keep => 2 + n,
            _ => 2 + self.keep + 1,
        }
    }

    /// The title, and the notes that fit after it.
    fn title_line(&self, width: Option<usize>) -> String {
        let mut line = clean(&self.title);
        for note in &self.notes {
            let more = format!(" · {note}");
            if width.is_some_and(|w| width_of(&line) + width_of(&more) > w) {
                break;
            }
            line.push_str(&more);
        }
        line
    }

    /// Its lines, `width` characters at most (`None`: no limit), `height` lines at most: the
    /// rows that do not fit are counted on the last line, `… N more keys`.
    pub(crate) fn render(&self, width: Option<usize>, height: usize) -> Vec<ScreenLine> {
        let mut out = Vec::new();
        if height == 0 {
            return out;
        }
        out.push(ScreenLine::new(self.title_line(width), Look::Section));
        let rows = self.table.rows();
        if rows == 0 {
            if height > 1 {
                out.push(ScreenLine::new(format!("  {}", self.empty), Look::Note));
            }
            return out;
        }
        if height == 2 {
            out.push(ScreenLine::new(
                format!("… {rows} {} (no room)", self.noun),
                Look::Note,
            ));
            return out;
        }
        if height == 1 {
            return out;
        }
        let (header, lines) = self.table.lines(width);
        out.push(ScreenLine::new(header, Look::Header));
        let room = height - 2;
        let shown = if rows <= room { rows } else { room - 1 };
        out.extend(
            lines
                .into_iter()
                .take(shown)
                .map(|l| ScreenLine::new(l, Look::Plain)),
        );
        if shown < rows {
            out.push(ScreenLine::new(
                format!("… {} more {}", rows - shown, self.noun),
                Look::Note,
            ));
        }
        out
    }
}

/// Lines for each section out of `height`: each first gets [`Section::least`] (in order, while
/// lines last), then what is left goes to them in order, each up to [`Section::want`].
pub(crate) fn share(sections: &[Section], height: usize) -> Vec<usize> {
    let mut left = height;
    let mut given: Vec<usize> = sections
        .iter()
        .map(|s| {
            let g = s.least().min(left);
            left -= g;
            g
        })
        .collect();
    for (s, g) in sections.iter().zip(&mut given) {
        let more = (s.want() - *g).min(left);
        *g += more;
        left -= more;
    }
    given
}

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// One column of a [`Table`].
pub(crate) struct Column {
    /// Shown whole, or the column is not shown.
    pub header: &'static str,
    pub cells: Vec<String>,
    pub align: Align,
    /// When the columns do not fit, the highest rank goes first; 0: never dropped.
    pub drop: u8,
    /// A name column may be cut (with `…`) to this many characters rather than dropped;
    /// `None`: shown whole or not at all (numbers, times).
    pub squeeze_to: Option<usize>,
}

impl Column {
    /// Right-aligned, never cut.
    pub(crate) fn number(header: &'static str, drop: u8, cells: Vec<String>) -> Self {
        Self {
            header,
            cells,
            align: Align::Right,
            drop,
            squeeze_to: None,
        }
    }

    /// Left-aligned; cut to `squeeze_to` characters at the narrowest.
    pub(crate) fn text(
        header: &'static str,
        drop: u8,
        squeeze_to: usize,
        cells: impl Iterator<Item = String>,
    ) -> Self {
        Self {
            header,
            cells: cells.collect(),
            align: Align::Left,
            drop,
            squeeze_to: Some(squeeze_to),
        }
    }

    /// Its width with nothing cut.
    fn natural(&self) -> usize {
        self.cells
            .iter()
            .map(|c| width_of(c))
            .chain([width_of(self.header)])
            .max()
            .unwrap_or(0)
    }

    /// Its narrowest: the header whole, and a name cut no shorter than `squeeze_to`.
    fn least(&self) -> usize {
        let n = self.natural();
        match self.squeeze_to {
            Some(m) => n.min(m).max(width_of(self.header)),
            None => n,
        }
    }
}

/// Columns of text with a header each; which are shown, and how wide, depends on the width.
pub(crate) struct Table {
    /// In the order they are shown.
    pub columns: Vec<Column>,
}

impl Table {
    /// `columns` (given by importance, or in any order) shown in the order of `order` (by
    /// header); a header not in `order` goes last.
    pub(crate) fn new<const N: usize>(mut columns: Vec<Column>, order: [&str; N]) -> Self {
        columns.sort_by_key(|c| order.iter().position(|h| *h == c.header).unwrap_or(N));
        Self { columns }
    }

    /// Rows (the longest column's cells).
    pub(crate) fn rows(&self) -> usize {
        self.columns
            .iter()
            .map(|c| c.cells.len())
            .max()
            .unwrap_or(0)
    }

    /// The columns shown in `width` (`None`: all) and the width of each: `(index, width)`, in
    /// the order shown. While the narrowest of the columns do not fit, the one with the
    /// highest `drop` goes (of equal ranks, the one shown last); then the room left widens the
    /// columns that were cut, evenly (a character each in turn, the most important first), up
    /// to their natural width.
    pub(crate) fn layout(&self, width: Option<usize>) -> Vec<(usize, usize)> {
        let Some(width) = width else {
            return self
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| (i, c.natural()))
                .collect();
        };
        let mut shown: Vec<usize> = (0..self.columns.len()).collect();
        let need = |shown: &[usize]| -> usize {
            shown
                .iter()
                .map(|&i| self.columns[i].least())
                .sum::<usize>()
                + GAP * shown.len().saturating_sub(1)
        };
        while need(&shown) > width {
            let Some((at, _)) = shown
                .iter()
                .enumerate()
                .filter(|(_, &i)| self.columns[i].drop > 0)
                .max_by_key(|(_, &i)| self.columns[i].drop)
            else {
                break;
            };
            shown.remove(at);
        }
        let mut widths: Vec<usize> = shown.iter().map(|&i| self.columns[i].least()).collect();
        let mut left = width.saturating_sub(need(&shown));
        let mut by_rank: Vec<usize> = (0..shown.len()).collect();
        by_rank.sort_by_key(|&k| self.columns[shown[k]].drop);
        // One character at a time to each column still cut, the most important first: a
        // short name is whole before a long one gets longer.
        while left > 0 {
            let mut gave = false;
            for &k in &by_rank {
                if left > 0 && widths[k] < self.columns[shown[k]].natural() {
                    widths[k] += 1;
                    left -= 1;
                    gave = true;
                }
            }
            if !gave {
                break;
            }
        }
        shown.into_iter().zip(widths).collect()
    }

    /// The header line and one line per row, `width` characters at most (`None`: no limit);
    /// trailing spaces trimmed.
    pub(crate) fn lines(&self, width: Option<usize>) -> (String, Vec<String>) {
        let layout = self.layout(width);
        let line = |cell: &dyn Fn(&Column) -> &str| -> String {
            let parts: Vec<String> = layout
                .iter()
                .map(|&(i, w)| {
                    let c = &self.columns[i];
                    pad(&fit(cell(c), w), w, c.align)
                })
                .collect();
            parts.join(&" ".repeat(GAP)).trim_end().to_string()
        };
        let header = line(&|c| c.header);
        let rows = (0..self.rows())
            .map(|r| line(&|c| c.cells.get(r).map_or("", String::as_str)))
            .collect();
        (header, rows)
    }
}

/// `items` joined by `sep` into lines of at most `width` characters (`None`: one line); an
/// item is never split, and one longer than a line is cut with `…`.
fn wrap(items: &[String], sep: &str, width: Option<usize>) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for item in items {
        let item = match width {
            Some(w) => fit(item, w),
            None => item.clone(),
        };
        if cur.is_empty() {
            cur = item;
        } else if width.is_none_or(|w| width_of(&cur) + width_of(sep) + width_of(&item) <= w) {
            cur.push_str(sep);
            cur.push_str(&item);
        } else {
            lines.push(std::mem::replace(&mut cur, item));
        }
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// Characters `s` takes on the screen (see the module's docs).
fn width_of(s: &str) -> usize {
    s.chars().count()
}

/// `s` cut to `w` characters: its first `w - 1` and `…`, when it is longer.
fn fit(s: &str, w: usize) -> String {
    if width_of(s) <= w {
        return s.to_string();
    }
    if w == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(w - 1).collect();
    out.push('…');
    out
}

/// `s` padded with spaces to `w` characters.
fn pad(s: &str, w: usize, align: Align) -> String {
    let fill = " ".repeat(w.saturating_sub(width_of(s)));
    match align {
        Align::Left => format!("{s}{fill}"),
        Align::Right => format!("{fill}{s}"),
    }
}

/// Control characters (escape sequences) shown as `?`.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// An optional value as shown: `-` for none.
fn or_dash(v: Option<&str>) -> String {
    v.map_or_else(|| "-".to_string(), clean)
}

/// `HH:MM:SS` (UTC) of ms since the Unix epoch.
fn hms(ms: u64) -> String {
    let secs = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    #[test]
    fn the_admin_url_is_http_host_port() {
        let a = Admin::parse("http://127.0.0.1:9091/", None).unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 9091));
        let a = Admin::parse("http://[::1]:9091", None).unwrap();
        assert_eq!(a.host, "::1");
        assert!(Admin::parse("https://h:1", None).is_err());
        assert!(Admin::parse("http://h", None).is_err());
    }

    /// The lines the live view draws in a `w`×`h` terminal, as the terminal holds them.
    fn drawn(u: &UsageView, w: u16, h: u16) -> Vec<String> {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(f, &Ok(u.clone()))).unwrap();
        let buf = t.backend().buffer();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
                    .trim_end()
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn a_frame_holds_the_keys_and_the_refusals() {
        let u: UsageView = serde_json::from_value(serde_json::json!({
            "generated_at_ms": 1,
            "config": {"file": "gw.yaml", "started_at_ms": 0, "keys": 3, "partners": 1,
                       "partner_limit": 150, "plans": [], "window_seconds": 10, "last_reload": null},
            "search": null, "cluster": null, "overrides": [], "anonymous_requests": 4,
            "keys": [{"key": "shop-1", "plan": "basic", "partner": null, "override": false, "requests": 9,
                      "admitted": 7, "refusals": {"rate_limited": 2, "forbidden": 0, "invalid": 0},
                      "shadowed": 0, "budget_left": 0, "limit": 40, "state": "suspended"}],
            "refusals": [{"at_ms": 3_600_000, "key": "shop-1", "route": "client", "status": 429, "code": "rate_limited"}],
        }))
        .unwrap();
        let text = drawn(&u, 140, 30).join("\n");
        assert!(text.contains("shop-1 (suspended)"), "{text}");
        assert!(text.contains("429 rate_limited"));
        assert!(text.contains("3 keys"));
        assert!(text.contains("01:00:00"), "{text}");
    }

    #[test]
    fn the_timeline_is_a_sparkline_of_the_last_points_that_fit() {
        let mut u = busy();
        u.timeline = (0..60u64)
            .map(|i| {
                let counts = [
                    ("forwarded", i % 9),
                    ("rate_limited", u64::from(i == 59) * 8),
                ]
                .into_iter()
                .map(|(o, n)| (o.to_string(), n))
                .collect();
                crate::admin::view::TimelinePoint {
                    at_ms: i * 10_000,
                    counts,
                }
            })
            .collect();
        let line = sparkline(&u, None).unwrap();
        // Point 59: 5 forwarded + 8 refused = 13, the peak: a full block, last.
        assert!(line.starts_with("last 10 min  ▁"), "{line}");
        assert!(line.ends_with("█ busiest 10 s: 13, 8 refused"), "{line}");
        assert_eq!(
            line.chars().count(),
            "last 10 min ".len() + 60 + " busiest 10 s: 13, 8 refused".len()
        );
        // A narrow terminal keeps the most recent points.
        let narrow = sparkline(&u, Some(50)).unwrap();
        assert_eq!(narrow.chars().count(), 50);
        assert!(narrow.ends_with("█ busiest 10 s: 13, 8 refused"));
        let text = drawn(&u, 120, 40).join("\n");
        assert!(text.contains("last 10 min"), "{text}");
    }

    const LONG: &str = "enterprise-customer-with-a-rather-long-key-name-";

    /// A busy gateway's view: four plans (one in shadow mode), 20 keys (long names, short
    /// ones, partner-managed ones, an override), 10 refusals of 14, a cluster, a reload.
    fn busy() -> UsageView {
        let plans: Vec<serde_json::Value> = ["basic", "standard", "pro", "enterprise"]
            .iter()
            .enumerate()
            .map(|(i, p)| {
                serde_json::json!({"name": p, "plan_id": i + 1, "limit": 40 * (i + 1),
                    "allow": "all", "shadow": i == 3, "keys": 5})
            })
            .collect();
        let keys: Vec<serde_json::Value> = (0..20)
            .map(|i| {
                let name = match i % 4 {
                    0 => format!("{LONG}{i:02}"),
                    1 => format!("shop-{i}"),
                    2 => format!("partner-managed-store-{i:02}"),
                    _ => format!("k{i}"),
                };
                let plan = ["basic", "standard", "pro", "enterprise"][i % 4];
                let partner = (i % 4 == 2).then_some("acme-reseller");
                let shadowed = if i % 4 == 3 { 17 } else { 0 };
                serde_json::json!({"key": name, "plan": plan, "partner": partner,
                    "override": i == 6, "requests": 123_456 - i * 1000, "admitted": 120_000 - i * 1000,
                    "refusals": {"rate_limited": 3000 + i, "forbidden": 12, "invalid": 444},
                    "codes": {"rate_limited": 3000 + i, "plan_restricted": 10, "wrong_credential": 2, "invalid_body": 444},
                    "shadowed": shadowed, "budget_left": 7, "limit": 1200})
            })
            .collect();
        let refusals: Vec<serde_json::Value> = (0..14)
            .map(|i| {
                let key = (i % 3 != 0).then(|| format!("{LONG}{i:02}"));
                serde_json::json!({"at_ms": 1_700_000_000_000u64 - i * 1000, "key": key,
                    "route": "sendMessage", "status": 429, "code": "rate_limited"})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "generated_at_ms": 1_700_000_000_000u64,
            "config": {"file": "/etc/tollgate/gateway.yaml", "started_at_ms": 0, "keys": 2000,
                       "partners": 3, "partner_limit": 150, "plans": plans, "window_seconds": 10,
                       "last_reload": {"at_ms": 1_699_999_000_000u64, "result": "success", "error": null}},
            "search": null,
            "cluster": {"store_up": true, "replicas": 3, "redis": "redis://127.0.0.1:6379",
                        "key_prefix": "tollgate", "sync_interval_ms": 250},
            "overrides": [], "anonymous_requests": 42,
            "keys": keys, "refusals": refusals,
        }))
        .unwrap()
    }

    /// What a screen of `u` at `w`×`h` must hold, whatever the size (see the module's docs).
    fn check_screen(u: &UsageView, w: usize, h: usize) -> Vec<ScreenLine> {
        let lines = screen(&Ok(u.clone()), Mode::Live, Some(w), Some(h));
        let text: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        let all = text.join("\n");
        assert!(lines.len() <= h, "{} lines in {h}:\n{all}", lines.len());
        for l in &text {
            assert!(width_of(l) <= w, "{} > {w}: {l:?}", width_of(l));
        }
        // Every section's header holds every shown column's header whole.
        let sections = [keys_section(u), refusals_section(u, Mode::Live)];
        let headers: Vec<&ScreenLine> = lines.iter().filter(|l| l.look == Look::Header).collect();
        assert_eq!(headers.len(), 2, "{all}");
        for (s, header) in sections.iter().zip(&headers) {
            let layout = s.table.layout(Some(w));
            let (want, _) = s.table.lines(Some(w));
            assert_eq!(header.text, want);
            let mut at = 0;
            for &(i, cw) in &layout {
                let name = s.table.columns[i].header;
                assert!(cw >= width_of(name), "{name} in {cw}");
                let found = header.text[at..]
                    .find(name)
                    .unwrap_or_else(|| panic!("`{name}` not whole in {:?}", header.text));
                at += found + name.len();
            }
        }
        // Names cut only when the room is short of them, as little as the room allows, and
        // never below KEY_NAME_ROOM. The keys table's rows are the view's keys in order; a
        // row's first `key_w` characters are its key cell.
        let keys = &sections[0];
        let layout = keys.table.layout(Some(w));
        let key_w = layout[0].1;
        assert_eq!(keys.table.columns[layout[0].0].header, "key");
        assert!(key_w >= KEY_NAME_ROOM, "{key_w}");
        let at = lines.iter().position(|l| l.look == Look::Header).unwrap();
        let rows: Vec<&str> = lines[at + 1..]
            .iter()
            .take_while(|l| l.look == Look::Plain && !l.text.is_empty())
            .map(|l| l.text.as_str())
            .collect();
        assert!(!rows.is_empty(), "{all}");
        for (k, row) in u.keys.iter().zip(&rows) {
            let cell: String = row.chars().take(key_w).collect();
            let cell = cell.trim_end();
            if width_of(&k.key) <= key_w {
                assert_eq!(cell, k.key, "cut though it fits in {key_w}: {row:?}");
            } else {
                assert_eq!(cell, format!("{}…", &k.key[..key_w - 1]), "{row:?}");
                // Cut only when the table fills the width: no room was left to give.
                let used: usize =
                    layout.iter().map(|&(_, cw)| cw).sum::<usize>() + GAP * (layout.len() - 1);
                assert_eq!(used, w, "{:?} cut in a table {used} wide", k.key);
            }
        }
        // The rows that do not fit are counted.
        if rows.len() < u.keys.len() {
            let more = format!("… {} more keys", u.keys.len() - rows.len());
            assert!(all.contains(&more), "{more}:\n{all}");
        } else {
            assert!(!all.contains("more keys"), "{all}");
        }
        lines
    }

    #[test]
    fn blocked_addresses_show_below_the_keys_only_when_there_are_some() {
        let mut u = busy();
        let plain = screen(&Ok(u.clone()), Mode::Live, Some(80), Some(24));
        assert!(!plain.iter().any(|l| l.text.starts_with("Blocked")));
        u.blocks = ["203.0.113.7", "2001:db8:1:2::/64", "198.51.100.9"]
            .iter()
            .map(|a| crate::admin::view::BlockRow {
                address: a.to_string(),
                since: "2026-11-25T19:38:30Z".into(),
                until: "2026-11-25T19:43:30Z".into(),
                failures: 20,
                listener: "gateway".into(),
            })
            .collect();
        for (w, h) in [(80, 24), (120, 40)] {
            let lines = screen(&Ok(u.clone()), Mode::Live, Some(w), Some(h));
            assert!(lines.len() <= h);
            assert!(lines.iter().all(|l| width_of(&l.text) <= w));
            let text: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
            let at = text
                .iter()
                .position(|l| l.starts_with("Blocked addresses"))
                .unwrap_or_else(|| panic!("{}", text.join("\n")));
            assert!(at > text.iter().position(|l| l.starts_with("Busiest")).unwrap());
            let header = text[at + 1];
            for h in ["address", "until (UTC)"] {
                assert!(header.contains(h), "{header}");
            }
            // The /64 whole, the end of the block as a time of day.
            let rows = text[at + 2..].join("\n");
            assert!(rows.contains("2001:db8:1:2::/64") || rows.contains("more addresses"));
            assert!(rows.contains("19:43:30"), "{rows}");
        }
        let once = once_text(&u, None);
        assert!(once.contains("198.51.100.9") && once.contains("2001:db8:1:2::/64"));
    }

    #[test]
    fn at_80_by_24_everything_fits_and_says_what_it_left_out() {
        let u = busy();
        let lines = check_screen(&u, 80, 24);
        let all: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        let all = all.join("\n");
        eprintln!("{all}");
        assert_eq!(lines.len(), 24, "the screen is used:\n{all}");
        // The key name column is wider than KEY_NAME_ROOM when the room allows it, and
        // the most important columns are there.
        let (header, _) = keys_section(&u).table.lines(Some(80));
        for h in ["key", "requests", "budget", "limited", "shadowed"] {
            assert!(header.contains(h), "{header}");
        }
        assert!(all.contains("… "), "{all}");
        assert!(all.contains("more refusals"), "{all}");
        assert!(all.contains("shop-1 "), "{all}");
        // The live view draws exactly these lines.
        let drawn = drawn(&u, 80, 24);
        let want: Vec<String> = lines
            .iter()
            .map(|l| l.text.trim_end().to_string())
            .collect();
        assert_eq!(drawn, want);
    }

    #[test]
    fn at_120_by_40_more_columns_and_whole_names() {
        let u = busy();
        let lines = check_screen(&u, 120, 40);
        let all: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        let all = all.join("\n");
        eprintln!("{all}");
        let (h80, _) = keys_section(&u).table.lines(Some(80));
        let (h120, _) = keys_section(&u).table.lines(Some(120));
        assert!(h120.split_whitespace().count() > h80.split_whitespace().count());
        // The key column is wider than at 80, and the short names are whole.
        let key_w = |w| keys_section(&u).table.layout(Some(w))[0].1;
        assert!(key_w(120) > key_w(80), "{} {}", key_w(120), key_w(80));
        for k in u.keys.iter().filter(|k| k.key.len() <= key_w(120)) {
            assert!(all.contains(&format!("{} ", k.key)), "{}:\n{all}", k.key);
        }
        assert!(!all.contains("more keys"), "{all}");
        assert!(lines.len() <= 40);
    }

    #[test]
    fn narrow_short_and_empty_screens_stay_in_bounds() {
        let u = busy();
        for (w, h) in [
            (80, 10),
            (100, 30),
            (200, 60),
            (80, 5),
            (40, 12),
            (10, 3),
            (1, 1),
        ] {
            let lines = screen(&Ok(u.clone()), Mode::Live, Some(w), Some(h));
            assert!(lines.len() <= h, "{w}×{h}");
            assert!(lines.iter().all(|l| width_of(&l.text) <= w), "{w}×{h}");
        }
        let mut empty = busy();
        empty.keys.clear();
        empty.refusals.clear();
        let lines = check_screen_empty(&empty);
        assert!(lines.contains("no request with a key"), "{lines}");
        let e = screen(
            &Err("connection refused".into()),
            Mode::Live,
            Some(80),
            Some(24),
        );
        assert!(e.iter().any(|l| l.text.contains("connection refused")));
        // A long error is wrapped at spaces, not cut.
        let long = "127.0.0.1:9091: a rather long error message ".repeat(6);
        let e = screen(&Err(long.clone()), Mode::Live, Some(80), Some(24));
        assert!(e.len() > 3 && e.iter().all(|l| width_of(&l.text) <= 80));
        let joined: Vec<&str> = e[1..].iter().map(|l| l.text.as_str()).collect();
        assert_eq!(
            joined.join(" "),
            format!("tollgate top: {}", long.trim_end())
        );
    }

    fn check_screen_empty(u: &UsageView) -> String {
        let lines = screen(&Ok(u.clone()), Mode::Live, Some(80), Some(24));
        assert!(lines.len() <= 24);
        lines
            .iter()
            .map(|l| l.text.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn once_prints_its_rows_and_nothing_else() {
        let u = busy();
        for width in [None, Some(80), Some(120)] {
            let text = once_text(&u, width);
            eprintln!("{text}");
            assert!(text.ends_with('\n') && !text.ends_with("\n\n"), "{text:?}");
            assert!(!text.contains('\x1b'), "an escape sequence");
            assert!(text.lines().all(|l| l == l.trim_end()), "trailing spaces");
            // Every row the view has (every refusal too: the live view shows ten), no more
            // lines than those.
            let lines = screen(&Ok(u.clone()), Mode::Once, width, None);
            assert_eq!(text.lines().count(), lines.len());
            assert!(!text.contains("more keys") && !text.contains("more refusals"));
            if let Some(w) = width {
                assert!(text.lines().all(|l| width_of(l) <= w));
            } else {
                // Into a pipe: every column, every name whole.
                assert!(!text.contains('…'), "{text}");
                for k in &u.keys {
                    assert!(text.contains(&k.key));
                }
                let (header, _) = keys_section(&u).table.lines(None);
                assert_eq!(header.split_whitespace().count(), 9, "{header}");
                let refusals = text.lines().filter(|l| l.ends_with("429 rate_limited"));
                assert_eq!(refusals.count(), u.refusals.len(), "{text}");
            }
        }
        // Far fewer lines than the 48 it used to pad to, for a small view.
        let mut small = busy();
        small.keys.truncate(2);
        small.refusals.truncate(1);
        let text = once_text(&small, None);
        assert!(text.lines().count() < 20, "{text}");
        assert!(!text.lines().last().unwrap().trim().is_empty());
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        let mut u = busy();
        u.keys[0].key = "evil\x1b[2Jkey".into();
        let text = once_text(&u, None);
        assert!(!text.contains('\x1b'));
        assert!(text.contains("evil?[2Jkey"));
    }

    #[test]
    fn sections_share_a_short_screen_keys_first() {
        let u = busy();
        let sections = [keys_section(&u), refusals_section(&u, Mode::Live)];
        // Room for everything: everything.
        assert_eq!(share(&sections, 100), vec![22, 12]);
        // 21 lines: refusals keep 3 rows (+ title, header, "… more"), keys get the rest.
        assert_eq!(share(&sections, 21), vec![15, 6]);
        // Less than both minimums: the first section first.
        assert_eq!(share(&sections, 9), vec![8, 1]);
        for h in 0..40 {
            assert!(share(&sections, h).iter().sum::<usize>() <= h);
            for (s, n) in sections.iter().zip(share(&sections, h)) {
                assert_eq!(s.render(Some(80), n).len(), n, "{} in {n}", s.title);
            }
        }
    }

    #[test]
    fn a_quota_column_shows_when_a_key_has_a_quota() {
        let mut u = busy();
        let (header, _) = keys_section(&u).table.lines(None);
        assert!(!header.contains("quota"));
        u.keys[0].quota = Some(crate::admin::view::QuotaView {
            requests: 5000,
            per: "month".into(),
            used: 1200,
            left: 3800,
        });
        let (header, rows) = keys_section(&u).table.lines(None);
        assert!(header.trim_end().ends_with("quota"), "{header}");
        assert!(rows[0].trim_end().ends_with("1200/5000"), "{}", rows[0]);
        assert!(rows[1].trim_end().ends_with('-'), "{}", rows[1]);
    }

    #[test]
    fn columns_go_least_important_first() {
        let t = keys_section(&busy()).table;
        let names = |w: Option<usize>| -> Vec<&str> {
            t.layout(w)
                .iter()
                .map(|&(i, _)| t.columns[i].header)
                .collect()
        };
        let all = names(None);
        assert_eq!(all.len(), 9);
        let mut previous = all.clone();
        for w in (20..=200).rev() {
            let now = names(Some(w));
            // Narrower never shows a column a wider width did not.
            assert!(now.iter().all(|h| previous.contains(h)), "{w}: {now:?}");
            // Whatever goes, what stays is more important than it.
            let drop_of = |h: &str| t.columns.iter().find(|c| c.header == h).unwrap().drop;
            let gone: Vec<&&str> = all.iter().filter(|h| !now.contains(h)).collect();
            for g in &gone {
                assert!(now.iter().all(|h| drop_of(h) <= drop_of(g)), "{w}: {now:?}");
            }
            previous = now;
        }
        assert_eq!(names(Some(20)), vec!["key"]);
    }
}
