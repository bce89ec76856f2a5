//! The operator's view: `/api/usage` on the wire, the page rendered by a real headless browser
//! (Debian's `chromium`, installed by `.ci/run`), and `tollgate top --once`.

use std::process::Command;

use crate::harness::{
    admin, admin_with, config_for, eventually, send_raw, wait_ready, Gateway, Mode, Upstream,
};
use tollgate_core::digest::Digest;

/// 50 requests of basic-1 (40 admitted, 10 rate limited), 5 of standard-1, 2 refused for the
/// plan, 3 without a key.
fn traffic(gw: &Gateway) {
    for _ in 0..50 {
        gw.call("basic-key-1", "GET", "/v2/client/getStatus", "");
    }
    for _ in 0..5 {
        gw.call("standard-key-1", "GET", "/v2/client/getStatus", "");
    }
    for _ in 0..2 {
        gw.call(
            "basic-key-1",
            "POST",
            "/v2/settings/webhook/set",
            r#"{"url":"https://x.example/h"}"#,
        );
    }
    for _ in 0..3 {
        gw.call("not-a-key", "GET", "/v2/client/getStatus", "");
    }
}

/// [`traffic`], then until the gateway has counted all of it: a request is counted when its
/// exchange is logged, just after its answer went out, so the last answer can reach the test
/// before its count.
fn traffic_counted(gw: &Gateway, token: Option<&str>) {
    traffic(gw);
    eventually("the traffic counted", || {
        let u = admin_with(gw.config.process.admin_listen, "GET", "/api/usage", token).json();
        let keyed: u64 = u["keys"]
            .as_array()
            .map_or(0, |k| k.iter().filter_map(|k| k["requests"].as_u64()).sum());
        u["anonymous_requests"] == 3 && keyed == 57
    });
}

#[test]
fn the_usage_api_shows_the_busiest_keys_and_the_latest_refusals_and_never_a_key() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    traffic_counted(&gw, None);
    let r = admin(gw.config.process.admin_listen, "GET", "/api/usage");
    assert_eq!(r.status, 200);
    let body = String::from_utf8(r.body.clone()).unwrap();
    for secret in ["basic-key-1", "standard-key-1", "not-a-key"] {
        assert!(!body.contains(secret), "a key on the page: {secret}");
        assert!(
            !body.contains(&Digest::of(secret.as_bytes()).to_hex()),
            "a digest on the page"
        );
    }
    let u = r.json();
    let top = &u["keys"][0];
    assert_eq!(top["key"], "basic-1");
    assert_eq!(top["plan"], "basic");
    assert_eq!(top["requests"], 52);
    assert_eq!(top["admitted"], 40);
    assert_eq!(top["refusals"]["rate_limited"], 10);
    assert_eq!(top["refusals"]["forbidden"], 2);
    assert_eq!(
        top["codes"],
        serde_json::json!({"rate_limited": 10, "plan_restricted": 2})
    );
    assert_eq!(top["state"], "active");
    assert_eq!(top["budget_left"], 0);
    assert_eq!(u["keys"][1]["key"], "standard-1");
    assert_eq!(u["anonymous_requests"], 3);
    let refusals = u["refusals"].as_array().unwrap();
    assert_eq!(refusals[0]["code"], "unauthorized");
    assert!(refusals.iter().any(|r| r["code"] == "rate_limited"
        && r["key"] == "basic-1"
        && r["route"] == "client"
        && r["status"] == 429));
    assert!(refusals
        .iter()
        .any(|r| r["code"] == "plan_restricted" && r["route"] == "webhook_set"));
    assert_eq!(u["config"]["plans"][0]["name"], "basic");
    assert_eq!(u["config"]["keys"], 5);
    let per_plan: Vec<u64> = u["config"]["plans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["keys"].as_u64().unwrap())
        .collect();
    assert_eq!(
        per_plan.iter().sum::<u64>(),
        5,
        "every customer key on one plan: {per_plan:?}"
    );
    assert!(per_plan.iter().all(|&n| n > 0), "{per_plan:?}");

    // Search by name: a key with no request this minute shows too, with its budget.
    let r = admin(gw.config.process.admin_listen, "GET", "/api/usage?key=PRO").json();
    assert_eq!(r["keys"].as_array().unwrap().len(), 1);
    assert_eq!(r["keys"][0]["key"], "pro-1");
    assert_eq!(r["keys"][0]["requests"], 0);
    assert_eq!(r["keys"][0]["budget_left"], 150);
    // A search repeated or misspelt answers no other question: 400 naming it.
    for (query, named) in [("?key=PRO&key=basic", "`key`"), ("?name=PRO", "`name`")] {
        let r = admin(
            gw.config.process.admin_listen,
            "GET",
            &format!("/api/usage{query}"),
        );
        assert_eq!(r.status, 400, "{query}");
        let p = r.json();
        assert_eq!(p["code"], "invalid_query", "{query}");
        assert!(
            p["detail"].as_str().unwrap().contains(named),
            "{query}: {p}"
        );
    }
}

fn chromium() -> String {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c.to_string();
        }
    }
    panic!("no headless browser: apt-get install chromium (.ci/run installs it)");
}

/// The page at `url` as a real browser renders it, scripts run, after `ms` of (virtual) time.
fn render(url: &str, ms: u32) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium())
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            &format!("--user-data-dir={}", profile.path().display()),
            &format!("--virtual-time-budget={ms}"),
            "--dump-dom",
            url,
        ])
        .output()
        .expect("the browser runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_headless_browser_shows_the_busiest_key_and_a_refusals_code() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    wait_ready(gw.config.process.admin_listen, 200);
    traffic_counted(&gw, None);
    let dom = render(&format!("http://{}/", gw.config.process.admin_listen), 3000);
    // The busiest key's row, filled in by the page's script from /api/usage.
    // Its refusals by code: a 403 for the plan is told from any other 403.
    let row = r#"<tr data-key="basic-1"><td>basic-1</td><td>basic</td><td>-</td><td class="n">52</td><td class="n">40</td><td><span class="pill" data-code="rate_limited">rate_limited 10</span> <span class="pill" data-code="plan_restricted">plan_restricted 2</span></td>"#;
    assert!(
        dom.contains(row),
        "the busiest key's row is not on the page:\n{dom}"
    );
    assert!(
        dom.contains(r#"<span class="pill">429 rate_limited</span>"#),
        "{dom}"
    );
    assert!(dom.contains("5 keys · 2 partners · 3 plans"), "{dom}");
    assert!(!dom.contains("basic-key-1"));
}

#[test]
fn the_page_lists_every_refusal_the_api_keeps_and_counts_the_busiest_10_s_as_top_does() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let admin_addr = gw.config.process.admin_listen;
    wait_ready(admin_addr, 200);
    // More refusals than the page once showed (20), fewer than the ring keeps (64).
    for _ in 0..40 {
        assert_eq!(
            gw.call("not-a-key", "GET", "/v2/client/getStatus", "")
                .status,
            401
        );
    }
    eventually("the refusals counted", || {
        let u = admin(admin_addr, "GET", "/api/usage").json();
        u["refusals"].as_array().map_or(0, Vec::len) == 40
    });
    let dom = render(&format!("http://{admin_addr}/"), 3000);
    let table = &dom[dom.find(r#"<table id="refusals">"#).unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(table.matches("401 unauthorized").count(), 40, "{table}");
    // The busiest 10 s counts every outcome, as `top`'s sparkline does (40 here, or split
    // over two points if the traffic crossed a 10 s boundary).
    let top = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["top", "--once", "--admin", &format!("http://{admin_addr}")])
        .output()
        .unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    let busiest = |text: &str, at: &str, end: char| -> u64 {
        let from = text.find(at).unwrap_or_else(|| panic!("no {at:?}: {text}")) + at.len();
        text[from..]
            .split(end)
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let on_page = busiest(&dom, "busiest 10 s: ", ' ');
    assert_eq!(on_page, busiest(&top, "busiest 10 s: ", ','), "{top}");
    assert!((20..=40).contains(&on_page), "{on_page}");
}

/// The `(start, values)` of each line of the page's timeline chart, by outcome.
fn chart_lines(dom: &str) -> (u64, Vec<(String, Vec<u64>)>) {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let at = tag.find(&format!("{name}=\""))? + name.len() + 2;
        Some(tag[at..at + tag[at..].find('"')?].to_string())
    };
    let svg_at = dom
        .find("<svg id=\"timeline-chart\"")
        .expect("the chart is on the page");
    let svg = &dom[svg_at..svg_at + dom[svg_at..].find("</svg>").unwrap()];
    let start = attr(svg, "data-start").unwrap().parse().unwrap();
    let lines = svg
        .split("<polyline ")
        .skip(1)
        .map(|tag| {
            let values = attr(tag, "data-values")
                .unwrap()
                .split(',')
                .map(|v| v.parse().unwrap())
                .collect::<Vec<u64>>();
            // Drawn where the values say: one point each, higher for more.
            let points = attr(tag, "points").unwrap();
            assert_eq!(points.split(' ').count(), values.len());
            (attr(tag, "data-outcome").unwrap(), values)
        })
        .collect();
    (start, lines)
}

#[test]
fn the_page_draws_the_timeline_that_the_api_gives() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    wait_ready(gw.config.process.admin_listen, 200);
    traffic_counted(&gw, None);
    let admin_addr = gw.config.process.admin_listen;
    let dom = render(&format!("http://{admin_addr}/"), 3000);
    let api = admin(admin_addr, "GET", "/api/usage").json();
    let tl = api["timeline"].as_array().unwrap();
    assert_eq!(tl.len(), 60, "always 60 points");
    let (start, lines) = chart_lines(&dom);
    let outcomes: Vec<&str> = lines.iter().map(|(o, _)| o.as_str()).collect();
    assert!(
        outcomes.contains(&"forwarded") && outcomes.contains(&"rate_limited"),
        "{outcomes:?}"
    );
    // The page and the test read the API a moment apart: the window may have moved on by a
    // point, so the points are matched by their time.
    let api_start = tl[0]["at_ms"].as_u64().unwrap();
    assert_eq!(api_start % 10_000, 0);
    let shift = ((api_start - start) / 10_000) as usize;
    assert!(shift <= 1, "the page's window is {shift} points behind");
    for (outcome, values) in &lines {
        assert_eq!(values.len(), 60);
        for (i, v) in values.iter().enumerate().skip(shift) {
            assert_eq!(
                Some(*v),
                tl[i - shift][outcome.as_str()].as_u64(),
                "{outcome} at point {i}"
            );
        }
    }
    // What the traffic was: 45 forwarded (40 of basic-1, 5 of standard-1), 10 rate limited,
    // 2 forbidden, 3 unauthorized.
    let total = |o: &str| -> u64 { tl.iter().map(|p| p[o].as_u64().unwrap()).sum() };
    assert_eq!(
        (
            total("forwarded"),
            total("rate_limited"),
            total("forbidden"),
            total("unauthorized")
        ),
        (45, 10, 2, 3)
    );
}

#[test]
fn behind_the_admin_token_the_page_asks_for_it_and_shows_nothing() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).admin_token("admin-secret-2"));
    wait_ready(gw.config.process.admin_listen, 200);
    traffic_counted(&gw, Some("admin-secret-2"));
    let r = admin(gw.config.process.admin_listen, "GET", "/");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let raw =
        "GET / HTTP/1.1\r\nHost: localhost\r\nAccept: text/html,*/*\r\nConnection: close\r\n\r\n";
    let r = send_raw(gw.config.process.admin_listen, raw.as_bytes());
    assert_eq!(r.status, 401);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(!String::from_utf8_lossy(&r.body).contains("basic-1"));
    assert_eq!(
        admin(gw.config.process.admin_listen, "GET", "/api/usage").status,
        401
    );
    assert_eq!(
        admin_with(
            gw.config.process.admin_listen,
            "GET",
            "/api/usage",
            Some("admin-secret-2")
        )
        .status,
        200
    );
    let dom = render(&format!("http://{}/", gw.config.process.admin_listen), 2000);
    assert!(
        dom.contains(r#"id="locked" style="display: block;""#),
        "{dom}"
    );
    assert!(!dom.contains("basic-1"), "data shown without the token");
}

#[test]
fn top_once_prints_the_same_view_in_the_terminal() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).admin_token("admin-secret-3"));
    traffic_counted(&gw, Some("admin-secret-3"));
    let admin = format!("http://{}", gw.config.process.admin_listen);
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["top", "--admin", &admin, "--once"])
        .env("TOLLGATE_ADMIN_TOKEN", "admin-secret-3")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.contains("basic-1"))
        .unwrap_or_else(|| panic!("{text}"));
    for field in ["basic", "52", "40", "10"] {
        assert!(line.contains(field), "{line}");
    }
    assert!(text.contains("429 rate_limited"), "{text}");
    // Without the token: a clear error, exit 1.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["top", "--admin", &admin, "--once"])
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("401") && err.contains("is not set"), "{err}");
    // A wrong one, and the live view with no terminal: each said as it is.
    for (args, token, said) in [
        (&["--once"][..], "wrong", "was refused"),
        (&[][..], "admin-secret-3", "needs a terminal"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["top", "--admin", &admin])
            .args(args)
            .env("TOLLGATE_ADMIN_TOKEN", token)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success() && err.contains(said), "{err}");
    }
}
