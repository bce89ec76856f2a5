//! `tollgate top --admin URL`: the usage view in a terminal, refreshed every 2 s (ratatui), for
//! operators on a shell. It reads `/api/usage` of a running gateway's admin listener, as the
//! page does; the token, when the listener needs one, comes from `TOLLGATE_ADMIN_TOKEN` (not a
//! flag: a flag shows in `ps`). `--once` prints one frame as text and exits (for scripts).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::admin::view::UsageView;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};
use ratatui::{Frame, Terminal};

/// Where the admin listener is, and its token.
pub struct Admin {
    host: String,
    port: u16,
    token: Option<String>,
}

impl Admin {
    /// `http://host:port` (https is not served by the admin listener).
    pub fn parse(url: &str, token: Option<String>) -> Result<Self, String> {
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
    pub fn usage(&self) -> Result<UsageView, String> {
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
        s.take(16 << 20)
            .read_to_end(&mut raw)
            .map_err(|e| e.to_string())?;
        let at = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("an answer without a head")?;
        let head = String::from_utf8_lossy(&raw[..at]);
        let status = head.split(' ').nth(1).unwrap_or("?");
        if status != "200" {
            return Err(format!(
                "/api/usage answered {status}{}",
                if status == "401" {
                    " (set TOLLGATE_ADMIN_TOKEN)"
                } else {
                    ""
                }
            ));
        }
        serde_json::from_slice(&raw[at + 4..]).map_err(|e| format!("/api/usage: {e}"))
    }
}

/// Run the live view until `q` (or Esc, or Ctrl-C).
pub fn run(admin: &Admin) -> Result<(), String> {
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

/// One frame, as text (`--once`).
pub fn once(admin: &Admin) -> Result<String, String> {
    let usage = admin.usage()?;
    let mut terminal = Terminal::new(TestBackend::new(140, 48)).map_err(|e| e.to_string())?;
    terminal
        .draw(|f| draw(f, &Ok(usage)))
        .map_err(|e| e.to_string())?;
    let buf = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        let line: String = (0..buf.area.width)
            .map(|x| buf[(x, y)].symbol().to_string())
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    Ok(out)
}

/// An optional value as shown: `-` for none.
fn or_dash(v: Option<&str>) -> String {
    v.unwrap_or("-").to_string()
}

fn draw(f: &mut Frame<'_>, usage: &Result<UsageView, String>) {
    let u = match usage {
        Ok(u) => u,
        Err(e) => {
            f.render_widget(
                Paragraph::new(format!("tollgate top: {e}   (q quits)"))
                    .block(Block::default().borders(Borders::ALL).title("Tollgate")),
                f.area(),
            );
            return;
        }
    };
    let c = &u.config;
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(3),
            Constraint::Min(8),
            Constraint::Length(12),
        ])
        .split(f.area());
    let reload = match &c.last_reload {
        None => "no reload since start".to_string(),
        Some(r) => format!("last reload: {}", r.result),
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
    let header = format!(
        "{} keys · {} partners · {} plans · {} s window · {reload} · {cluster} · {} overrides · {} requests without a key (1 min)",
        c.keys,
        c.partners,
        c.plans.len(),
        c.window_seconds,
        u.overrides.len(),
        u.anonymous_requests,
    );
    f.render_widget(
        Paragraph::new(Line::from(header)).block(
            Block::default()
                .borders(Borders::ALL)
                .title("Tollgate · refreshed every 2 s · q quits"),
        ),
        rows[0],
    );
    keys_table(f, u, rows[1]);
    refusals_table(f, u, rows[2]);
}

fn keys_table(f: &mut Frame<'_>, u: &UsageView, area: Rect) {
    let head = Row::new([
        "key", "plan", "partner", "requests", "admitted", "rate_lim", "forbid", "invalid",
        "shadow", "budget",
    ])
    .style(Style::default().add_modifier(Modifier::BOLD));
    let rows: Vec<Row<'_>> = u
        .keys
        .iter()
        .map(|k| {
            let plan = if k.overridden {
                format!("{}*", k.plan)
            } else {
                k.plan.clone()
            };
            Row::new([
                k.key.clone(),
                plan,
                or_dash(k.partner.as_deref()),
                k.requests.to_string(),
                k.admitted.to_string(),
                k.refusals.rate_limited.to_string(),
                k.refusals.forbidden.to_string(),
                k.refusals.invalid.to_string(),
                k.shadowed.to_string(),
                format!("{}/{}", k.budget_left, k.limit),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(24),
        Constraint::Length(12),
        Constraint::Length(14),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(11),
    ];
    f.render_widget(
        Table::new(rows, widths).header(head).block(
            Block::default()
                .borders(Borders::ALL)
                .title("Busiest keys, last minute (* partner override)"),
        ),
        area,
    );
}

fn refusals_table(f: &mut Frame<'_>, u: &UsageView, area: Rect) {
    let rows: Vec<Row<'_>> = u
        .refusals
        .iter()
        .take(10)
        .map(|r| {
            let secs = r.at_ms / 1000;
            let t = format!(
                "{:02}:{:02}:{:02}",
                secs / 3600 % 24,
                secs / 60 % 60,
                secs % 60
            );
            let status = r.status.map_or_else(|| "-".into(), |s| s.to_string());
            Row::new([
                t,
                or_dash(r.key.as_deref()),
                or_dash(r.route.as_deref()),
                format!("{status} {}", or_dash(r.code.as_deref())),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(10),
        Constraint::Length(24),
        Constraint::Length(22),
        Constraint::Length(30),
    ];
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(["time (UTC)", "key", "route", "code"]))
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .title("Latest refusals"),
            ),
        area,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_url_is_http_host_port() {
        let a = Admin::parse("http://127.0.0.1:9091/", None).unwrap();
        assert_eq!((a.host.as_str(), a.port), ("127.0.0.1", 9091));
        let a = Admin::parse("http://[::1]:9091", None).unwrap();
        assert_eq!(a.host, "::1");
        assert!(Admin::parse("https://h:1", None).is_err());
        assert!(Admin::parse("http://h", None).is_err());
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
                      "shadowed": 0, "budget_left": 0, "limit": 40}],
            "refusals": [{"at_ms": 3_600_000, "key": "shop-1", "route": "client", "status": 429, "code": "rate_limited"}],
        }))
        .unwrap();
        let mut t = Terminal::new(TestBackend::new(140, 30)).unwrap();
        t.draw(|f| draw(f, &Ok(u))).unwrap();
        let text: String = t
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        assert!(text.contains("shop-1"));
        assert!(text.contains("429 rate_limited"));
        assert!(text.contains("3 keys"));
    }
}
