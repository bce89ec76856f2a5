//! Quotas and the usage ledger on the wire: a monthly quota refused after its last unit with
//! `quota_exhausted` and both policies in the rate-limit fields, what is given back (a body
//! refusal, an upstream 5xx), counts that outlive a `SIGKILL`, and `/api/ledger` (JSON and
//! CSV) equal to the metrics' increments.

use std::net::SocketAddr;
use std::time::Duration;

use crate::harness::{
    admin, config_for, eventually, metric, metrics_page, send_raw, Gateway, Mode, Process,
    Response, Upstream,
};

const SEND: &str = "/v2/sendMessage/";
const GOOD: &str = r#"{"chatId":"79001234567@c.us","message":"hi"}"#;

fn send(gw: &Gateway, key: &str) -> Response {
    gw.call(key, "POST", SEND, GOOD)
}

/// `POST path` with `body` as JSON and `key`, to the gateway at `addr`.
fn post(addr: SocketAddr, key: &str, path: &str, body: &str) -> Response {
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes())
}

/// Seconds from now to the end of the UTC month (and the month's length), by the `time`
/// crate rather than Tollgate's own arithmetic.
fn month_now() -> (u64, u64) {
    let now = time::OffsetDateTime::now_utc();
    let first = now.date().replace_day(1).unwrap().midnight().assume_utc();
    let next = if now.month() == time::Month::December {
        time::Date::from_calendar_date(now.year() + 1, time::Month::January, 1)
    } else {
        time::Date::from_calendar_date(now.year(), now.month().next(), 1)
    }
    .unwrap()
    .midnight()
    .assume_utc();
    (
        (next - now).whole_seconds() as u64,
        (next - first).whole_seconds() as u64,
    )
}

fn today() -> String {
    let d = time::OffsetDateTime::now_utc().date();
    format!("{:04}-{:02}-{:02}", d.year(), d.month() as u8, d.day())
}

#[test]
fn a_monthly_quota_refuses_after_its_last_unit_with_both_policies_in_the_fields() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).plan_quota("basic", 3, "month"));
    let (_, month) = month_now();
    for left in (0..3).rev() {
        let r = send(&gw, "basic-key-1");
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("ratelimit-policy"),
            Some(format!("\"basic\";q=40;w=10, \"basic-month\";q=3;w={month}").as_str())
        );
        let state = r.header("ratelimit").unwrap();
        assert!(
            state.contains(&format!(", \"basic-month\";r={left};t=")),
            "{state}"
        );
    }
    let r = send(&gw, "basic-key-1");
    assert_eq!(r.status, 429);
    assert_eq!(r.json()["code"], "quota_exhausted");
    let (left, _) = month_now();
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        retry.abs_diff(left) <= 2,
        "Retry-After {retry}, {left} s left"
    );
    assert!(r
        .header("ratelimit")
        .unwrap()
        .ends_with(&format!("\"basic-month\";r=0;t={retry}")));
    // Another key on the plan has its own count.
    assert_eq!(send(&gw, "acme-customer-key").status, 200);
    let a = gw.config.process.admin_listen;
    // Recorded once the answer is sent (the logging phase).
    eventually("the refusal in the metrics", || {
        metric(
            &metrics_page(a),
            r#"tollgate_requests_total{outcome="quota_exhausted",plan="basic",route="send_message"}"#,
        ) == Some(1.0)
    });
    let k = admin(a, "GET", "/api/keys/basic-1").json();
    assert_eq!(
        (
            k["quota"]["used"].as_u64(),
            k["quota"]["remaining"].as_u64()
        ),
        (Some(3), Some(0))
    );
    // The operator's view: quota used and left, by key.
    let usage = admin(a, "GET", "/api/usage").json();
    let row = usage["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == "basic-1")
        .unwrap()
        .clone();
    assert_eq!(
        row["quota"],
        serde_json::json!({"requests": 3, "per": "month", "used": 3, "left": 0})
    );
    assert_eq!(row["codes"]["quota_exhausted"], 1);
    // The gauge is set by the keeper's pass, once a second.
    eventually("one key over its quota", || {
        metric(&metrics_page(a), "tollgate_quota_exhausted_keys") == Some(1.0)
    });
}

#[test]
fn a_body_refusal_and_an_upstream_5xx_are_given_back() {
    let up = Upstream::start(Mode::Status(503));
    let gw = Gateway::start(&config_for(&up).plan_quota("pro", 1, "day"));
    // Refused by its body after the quota step: given back before the answer is written.
    for _ in 0..3 {
        let bad = gw.call("pro-key-1", "POST", "/v2/sendGroup", "{}");
        assert_eq!(bad.status, 400);
        let state = bad.header("ratelimit").unwrap();
        assert!(state.contains("\"pro-day\";r=1;"), "{state}");
    }
    // The upstream answers 503: given back, so the next one is admitted too.
    for _ in 0..3 {
        let r = gw.call("pro-key-1", "POST", SEND, GOOD);
        assert_eq!(r.status, 503, "forwarded, and not served");
        let state = r.header("ratelimit").unwrap();
        assert!(state.contains("\"pro-day\";r=1;"), "{state}");
    }
    let k = gw.admin("GET", "/api/keys/pro-1").json();
    assert_eq!(k["quota"]["used"], 0);
}

/// How a request ends, for the table below.
enum End {
    /// The client sends and reads the answer.
    Answered,
    /// The client sends, reads the answer's head, and leaves (the body is 64 MiB).
    LeavesAfterTheHead,
    /// The client sends and leaves; then the upstream answers.
    LeavesBeforeTheAnswer,
}

#[test]
fn every_way_a_request_ends_is_charged_and_booked_by_one_rule() {
    use std::io::{Read, Write};
    // The rule (docs/configuration.md, "Quotas"): refused by the gateway, the refusal's
    // column, and given back when the refusal came after the quota step; forwarded, the
    // upstream's status decides both, whatever happens after it: 2xx and 4xx charged, 5xx
    // given back, no status (unreachable, timed out, the client gone before it) given back
    // and `upstream_failed`.
    let bad = "{}";
    let hook = r#"{"url":"https://hooks.example.com/x"}"#;
    #[rustfmt::skip]
    let cases = [
        ("refused before the quota step", Some(Mode::Ok), "/v2/settings/webhook/set", hook, End::Answered, 0, "plan_restricted"),
        ("refused by its body", Some(Mode::Ok), "/v2/sendGroup", bad, End::Answered, 0, "invalid_body"),
        ("answered 2xx", Some(Mode::Ok), SEND, GOOD, End::Answered, 1, "upstream_2xx"),
        ("answered 4xx", Some(Mode::Status(404)), SEND, GOOD, End::Answered, 1, "upstream_4xx"),
        ("answered 5xx", Some(Mode::Status(503)), SEND, GOOD, End::Answered, 0, "upstream_5xx"),
        ("answered 200, its body cut", Some(Mode::Cut), SEND, GOOD, End::Answered, 1, "upstream_2xx"),
        ("upstream unreachable (502)", None, SEND, GOOD, End::Answered, 0, "upstream_failed"),
        ("upstream timed out (504)", Some(Mode::Hang), SEND, GOOD, End::Answered, 0, "upstream_failed"),
        ("client gone after the answer's head", Some(Mode::Big), SEND, GOOD, End::LeavesAfterTheHead, 1, "upstream_2xx"),
        ("client gone before the answer", Some(Mode::HoldFirst), SEND, GOOD, End::LeavesBeforeTheAnswer, 0, "upstream_failed"),
    ];
    for (case, mode, path, body, end, charged, column) in cases {
        let up = mode.map(Upstream::start);
        let base = match &up {
            Some(up) => config_for(up),
            None => crate::harness::test_config(&format!(
                "http://127.0.0.1:{}",
                crate::harness::closed_port()
            )),
        };
        let gw = Gateway::start(
            &base
                .plan_quota("basic", 100, "day")
                .read_timeout_ms(300)
                .ledger(30),
        );
        let addr = gw.config.process.listen;
        let raw = format!(
            "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer basic-key-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        match end {
            End::Answered => {
                // Read to the end, whole or cut.
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                c.write_all(raw.as_bytes()).unwrap();
                let mut got = Vec::new();
                let _ = c.read_to_end(&mut got);
                assert!(got.starts_with(b"HTTP/1.1 "), "{case}: {got:?}");
            }
            End::LeavesAfterTheHead => {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.write_all(raw.as_bytes()).unwrap();
                let mut head = [0u8; 12];
                c.read_exact(&mut head).unwrap();
                assert_eq!(&head, b"HTTP/1.1 200", "{case}");
            }
            End::LeavesBeforeTheAnswer => {
                let mut c = std::net::TcpStream::connect(addr).unwrap();
                c.write_all(raw.as_bytes()).unwrap();
                let up = up.as_ref().unwrap();
                up.wait_for(1);
                drop(c);
                // Let go once the gateway has given the request up (see edge_h2.rs).
                up.wait_abandoned();
                up.release();
            }
        }
        let a = gw.config.process.admin_listen;
        // Booked when the request's last line is written: the client's leaving may come first.
        let mut row = serde_json::Value::Null;
        eventually(case, || {
            let rows = ledger(a, "?key=basic-1")["rows"].clone();
            row = rows.get(0).cloned().unwrap_or_default();
            row.get(column).and_then(|v| v.as_u64()) == Some(1)
        });
        let used = gw.admin("GET", "/api/keys/basic-1").json()["quota"]["used"].as_u64();
        assert_eq!(used, Some(charged), "{case}: {row}");
        let forwarded = u64::from(column.starts_with("upstream_"));
        assert_eq!(row["forwarded"].as_u64(), Some(forwarded), "{case}: {row}");
        let booked: u64 = row
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| !["day", "key", "plan", "partner", "forwarded"].contains(&k.as_str()))
            .filter_map(|(_, v)| v.as_u64())
            .sum();
        assert_eq!(booked, 1, "{case}: booked once: {row}");
    }
}

fn ledger(a: SocketAddr, query: &str) -> serde_json::Value {
    let r = admin(a, "GET", &format!("/api/ledger{query}"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[test]
fn counts_outlive_a_kill_and_the_ledger_matches_the_metrics() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("state.db");
    let config = config_for(&up)
        .plan_quota("standard", 5, "month")
        .plan_limit("basic", 2)
        .ledger(30)
        .state_path(db.to_str().unwrap());
    let (mut p, listen, a) = Process::run(dir.path(), "gw", &config);
    for _ in 0..3 {
        assert_eq!(post(listen, "standard-key-1", SEND, GOOD).status, 200);
    }
    // basic-1: 2 forwarded, 1 rate limited, 1 plan restricted.
    for _ in 0..2 {
        assert_eq!(post(listen, "basic-key-1", SEND, GOOD).status, 200);
    }
    assert_eq!(post(listen, "basic-key-1", SEND, GOOD).status, 429);
    let hook = post(listen, "basic-key-1", "/v2/settings/webhook/set", "{}");
    assert_eq!(hook.status, 403);
    let total = |plan: &str| -> f64 {
        metrics_page(a)
            .lines()
            .filter(|l| {
                l.starts_with("tollgate_requests_total{") && l.contains(&format!("plan=\"{plan}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    // A request is recorded after its answer is sent (the logging phase): the metrics show
    // every one first, and the ledger counts each before its metrics do.
    eventually("every request in the metrics", || {
        total("basic") == 4.0 && total("standard") == 3.0
    });
    // The ledger, asked now, holds every request made until now.
    let day = today();
    let rows = ledger(a, &format!("?from={day}&to={day}"))["rows"].clone();
    let row = |key: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key)
            .cloned()
            .unwrap_or_else(|| panic!("no row for {key}: {rows}"))
    };
    let basic = row("basic-1");
    assert_eq!(
        (
            basic["day"].as_str(),
            basic["plan"].as_str(),
            basic["forwarded"].as_u64(),
            basic["upstream_2xx"].as_u64(),
            basic["rate_limited"].as_u64(),
            basic["plan_restricted"].as_u64(),
        ),
        (
            Some(day.as_str()),
            Some("basic"),
            Some(2),
            Some(2),
            Some(1),
            Some(1)
        )
    );
    assert!(basic.get("unauthorized").is_none());
    for (key, plan) in [("basic-1", "basic"), ("standard-1", "standard")] {
        let r = row(key);
        let sum: u64 = r
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| {
                !matches!(k.as_str(), "day" | "key" | "plan" | "partner")
                    && !k.starts_with("upstream_")
            })
            .map(|(_, v)| v.as_u64().unwrap())
            .sum();
        assert_eq!(sum as f64, total(plan), "{key}: {r}");
    }
    // CSV, filtered by key.
    let csv = send_raw(
        a,
        format!("GET /api/ledger?key=standard-1 HTTP/1.1\r\nHost: {a}\r\nAccept: text/csv\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(csv.header("content-type"), Some("text/csv; charset=utf-8"));
    let text = String::from_utf8(csv.body).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with(
        "day,key,plan,partner,forwarded,upstream_2xx,upstream_4xx,upstream_5xx,upstream_failed,"
    ));
    assert!(
        lines[1].starts_with(&format!("{day},standard-1,standard,,3,3,0,0,0,")),
        "{}",
        lines[1]
    );
    // Bad queries name the parameter (one unknown or repeated too).
    for q in [
        "?from=2026-02-30",
        "?to=yesterday",
        "?from=2026-12-02&to=2026-12-01",
        "?from=2020-01-01&to=2026-01-01",
        "?key=standard-1&key=basic-1",
        "?day=2026-11-01",
    ] {
        let r = admin(a, "GET", &format!("/api/ledger{q}"));
        assert_eq!(
            (r.status, r.json()["code"].as_str()),
            (400, Some("invalid_query")),
            "{q}"
        );
    }

    // Killed outright: what `/api/ledger` kept is there after the restart.
    p.signal("KILL");
    let _ = p.wait_exit(Duration::from_secs(10));
    let (_p, listen, a) = Process::run(dir.path(), "gw", &config);
    for _ in 0..2 {
        assert_eq!(post(listen, "standard-key-1", SEND, GOOD).status, 200);
    }
    let r = post(listen, "standard-key-1", SEND, GOOD);
    assert_eq!(
        (r.status, r.json()["code"].as_str()),
        (429, Some("quota_exhausted"))
    );
    // The refusal is counted in the logging phase, after the answer: wait for it, bounded.
    let counts = || {
        let rows = ledger(a, "")["rows"].clone();
        let standard = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == "standard-1")
            .unwrap()
            .clone();
        (
            standard["forwarded"].as_u64(),
            standard["quota_exhausted"].as_u64(),
        )
    };
    eventually("the refusal in the ledger", || counts().1 == Some(1));
    assert_eq!(counts(), (Some(5), Some(1)));

    // Started again, the key is over its quota before any request of it: the gauge says so
    // (it counted only the keys refused since the start).
    drop(_p);
    let (_p, _, a) = Process::run(dir.path(), "gw", &config);
    eventually("the key over its quota in the gauge", || {
        metric(&metrics_page(a), "tollgate_quota_exhausted_keys") == Some(1.0)
    });
}

/// Three replicas sharing quotas and the ledger through one Redis: the fleet admits the quota
/// and at most one window's limit more per replica (the contract's bound), every replica then
/// refuses, and the ledger read from any replica holds the fleet's counts, equal to the sum of
/// the replicas' `tollgate_requests_total` increments, within 2 s.
#[test]
fn three_replicas_share_a_quota_and_sum_the_ledger_in_redis() {
    let _one = crate::harness::one_fleet();
    let up = Upstream::start(Mode::Ok);
    let redis = crate::harness::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    const QUOTA: usize = 30;
    // The window's limit, above what the test sends in a window: only the quota refuses.
    const LIMIT: usize = 200;
    let replicas: Vec<(Process, SocketAddr, SocketAddr)> = (0..3)
        .map(|i| {
            let config = config_for(&up)
                .cluster(&redis.url(), "tgquota", 20)
                .cluster_with(|c| c.timeout_ms = 1000)
                .plan_limit("basic", LIMIT as u32)
                .plan_quota("basic", QUOTA as u64, "day")
                .ledger(30);
            Process::run(dir.path(), &format!("gw{i}"), &config)
        })
        .collect();
    let mut admitted = 0;
    for i in 0..2 * QUOTA {
        let (_, listen, _) = &replicas[i % 3];
        let r = post(*listen, "basic-key-1", SEND, GOOD);
        match r.status {
            200 => admitted += 1,
            429 => assert_eq!(r.json()["code"], "quota_exhausted"),
            s => panic!("status {s}"),
        }
    }
    // At most one request per replica past the quota (a charge on a view that did not know
    // yet), whatever the spread.
    assert!(
        (QUOTA..=QUOTA + 3).contains(&admitted),
        "the fleet admitted {admitted} of a quota of {QUOTA}"
    );
    eprintln!("the fleet admitted {admitted} of a quota of {QUOTA}");
    // Every replica learns the fleet's count and refuses (a replica whose last exchange came
    // before another's last admissions may admit one more, and learns then).
    for (_, listen, _) in &replicas {
        eventually("the replica refuses for the quota", || {
            let r = post(*listen, "basic-key-1", SEND, GOOD);
            if r.status == 200 {
                admitted += 1;
            }
            r.status == 429
        });
    }
    assert!(admitted <= QUOTA + 3, "{admitted}");
    // The ledger, read from any replica, sums the fleet: equal to the metrics' increments.
    let fleet_total = || -> u64 {
        replicas
            .iter()
            .map(|(_, _, a)| {
                metrics_page(*a)
                    .lines()
                    .filter(|l| {
                        l.starts_with("tollgate_requests_total{") && l.contains("plan=\"basic\"")
                    })
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>() as u64
            })
            .sum()
    };
    for (_, _, a) in &replicas {
        eventually("the ledger holds every replica's counts", || {
            // Read each time: a request is recorded after its answer is sent.
            let total = fleet_total();
            let rows = ledger(*a, "?key=basic-1")["rows"].clone();
            let Some(r) = rows.as_array().and_then(|r| r.first()).cloned() else {
                return false;
            };
            // Named once (a row names its plan again only when it changes).
            r["plan"] == "basic"
                && r["forwarded"].as_u64() == Some(admitted as u64)
                && r["forwarded"].as_u64().unwrap() + r["quota_exhausted"].as_u64().unwrap()
                    == total
        });
    }
    // `quota.used` is the count charged, the ledger's, on every replica (never capped at the
    // quota).
    for (_, _, a) in &replicas {
        eventually("quota.used is the fleet's count", || {
            let r = crate::harness::admin(*a, "GET", "/api/keys/basic-1");
            r.json()["quota"]["used"].as_u64() == Some(admitted as u64)
        });
    }
    // What sharing cost Redis: the script calls (heartbeats and budgets: round trips) and the
    // plain commands that rode with the heartbeats, per admitted request.
    let calls: f64 = replicas
        .iter()
        .filter_map(|(_, _, a)| metric(&metrics_page(*a), "tollgate_cluster_redis_calls_total"))
        .sum();
    let stats = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "INFO", "commandstats"])
        .output()
        .unwrap()
        .stdout;
    let stats = String::from_utf8_lossy(&stats);
    let hincrby: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_hincrby:calls="))
        .and_then(|v| v.split(',').next()?.parse().ok())
        .unwrap_or(0);
    eprintln!(
        "per admitted request: {:.2} script calls, {:.2} HINCRBY riding on heartbeats",
        calls / admitted as f64,
        hincrby as f64 / admitted as f64
    );
    assert!(hincrby > 0, "{stats}");
    // Redis holds names and counts, never a key or a digest.
    let mut keys = std::process::Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "--scan",
            "--pattern",
            "tgquota:{meters}:*",
        ])
        .output()
        .unwrap()
        .stdout;
    keys.retain(|&b| b != b'\r');
    let keys = String::from_utf8(keys).unwrap();
    assert_eq!(keys.lines().count(), 2, "{keys}");
    let dump = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "HGETALL"])
        .arg(keys.lines().find(|k| k.contains(":l:")).unwrap())
        .output()
        .unwrap()
        .stdout;
    let dump = String::from_utf8_lossy(&dump);
    assert!(dump.contains("basic-1:upstream_2xx"), "{dump}");
    assert!(!dump.contains("basic-key-1"));
    assert!(!dump.contains(&tollgate::digest::Digest::of(b"basic-key-1").to_hex()));
}
