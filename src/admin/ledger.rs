//! `GET /api/ledger`: the usage ledger, one row per key and UTC day with traffic.
//!
//! `?from=YYYY-MM-DD&to=YYYY-MM-DD` (days inclusive, at most 400; both default to today, `from`
//! to `to`), `?key=NAME` filters. JSON by default (`{"from", "to", "rows": [...]}`); with
//! `Accept: text/csv`, CSV with a header row. Each row: `day`, `key`, `plan`, `partner`,
//! `forwarded` (the sum of the four upstream columns: every request sent upstream),
//! `upstream_2xx` (1xx–3xx too), `upstream_4xx`, `upstream_5xx`, `upstream_failed` (no answer:
//! 502, 504, or the client left first), then one column per refusal code but `unauthorized`
//! (never a key's) and the upstream failures' two (counted in `upstream_failed`).

use http::{Response, StatusCode};

use super::codes::AdminCode;
use super::reply::{json, problem, reply};
use super::view::{LedgerRow, LedgerView};
use super::Admin;
use crate::ledger::book::Row;
use crate::ledger::shown_columns;
use crate::metering::{day_str, parse_day};

/// The most days one query answers.
pub(crate) const MAX_DAYS: u32 = 400;

/// The column names, in order.
pub(crate) fn header() -> Vec<&'static str> {
    let mut h = vec!["day", "key", "plan", "partner", "forwarded"];
    h.extend(shown_columns().map(|c| c.name()));
    h
}

fn bad_query(detail: &str) -> Response<Vec<u8>> {
    *super::query::refused(detail)
}

/// The answer to `GET /api/ledger?query`, as CSV when `csv`.
pub(crate) async fn answer(admin: &Admin, query: Option<&str>, csv: bool) -> Response<Vec<u8>> {
    let (mut from, mut to, mut key) = (None, None, None);
    let params = match super::query::read(query, "/api/ledger") {
        Ok(params) => params,
        Err(refused) => return *refused,
    };
    for (k, v) in params {
        match k {
            "from" => from = Some(v),
            "to" => to = Some(v),
            "key" => key = Some(v),
            // The table names no other (`openapi_tests`).
            _ => {}
        }
    }
    let today = admin.ledger.today();
    let day = |name: &str, v: Option<String>, default: u32| -> Result<u32, String> {
        match v {
            None => Ok(default),
            Some(s) => {
                parse_day(&s).ok_or_else(|| format!("`{name}` must be a day as YYYY-MM-DD (UTC)"))
            }
        }
    };
    let to = match day("to", to, today) {
        Ok(d) => d,
        Err(detail) => return bad_query(&detail),
    };
    let from = match day("from", from, to) {
        Ok(d) => d,
        Err(detail) => return bad_query(&detail),
    };
    if from > to {
        return bad_query("`from` is after `to`");
    }
    if to - from + 1 > MAX_DAYS {
        return bad_query(&format!("at most {MAX_DAYS} days in one query"));
    }
    let rows = match admin.ledger.rows(from, to, key.as_deref()).await {
        Ok(r) => r,
        Err(e) => return problem(AdminCode::LedgerUnavailable, &e.to_string()),
    };
    if csv {
        reply(StatusCode::OK, "text/csv; charset=utf-8", to_csv(&rows))
    } else {
        let body = LedgerView {
            from: day_str(from),
            to: day_str(to),
            rows: rows.iter().map(|(d, k, r)| row_view(*d, k, r)).collect(),
        };
        json(StatusCode::OK, &body)
    }
}

/// The numbers of a row, in the header's order after `partner`.
fn numbers(r: &Row) -> Vec<u64> {
    let get = |c: &str| r.counts.get(c).copied().unwrap_or(0);
    let counts: Vec<(bool, u64)> = shown_columns()
        .map(|c| (c.is_upstream(), get(c.name())))
        .collect();
    let forwarded = counts.iter().filter(|(up, _)| *up).map(|(_, n)| n).sum();
    let mut out = vec![forwarded];
    out.extend(counts.iter().map(|(_, n)| n));
    out
}

fn row_view(day: u32, key: &str, r: &Row) -> LedgerRow {
    LedgerRow {
        day: day_str(day),
        key: key.into(),
        partner: r.partner.clone(),
        plan: r.plan.clone(),
        counts: header()[4..].iter().copied().zip(numbers(r)).collect(),
    }
}

/// A CSV field: quoted when it holds a comma, a quote or a line break.
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn to_csv(rows: &[(u32, String, Row)]) -> Vec<u8> {
    let mut out = header().join(",");
    out.push_str("\r\n");
    for (day, key, r) in rows {
        let mut cells = vec![
            day_str(*day),
            field(key),
            field(&r.plan),
            field(r.partner.as_deref().unwrap_or("")),
        ];
        cells.extend(numbers(r).iter().map(u64::to_string));
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_what_needs_it_and_lists_every_column() {
        let mut r = Row {
            plan: "basic".into(),
            partner: Some("a,b".into()),
            ..Row::default()
        };
        r.counts.insert("upstream_2xx".into(), 3);
        r.counts.insert("upstream_failed".into(), 1);
        r.counts.insert("rate_limited".into(), 2);
        let csv = String::from_utf8(to_csv(&[(20_418, "k".into(), r.clone())])).unwrap();
        let lines: Vec<&str> = csv.split("\r\n").collect();
        assert!(lines[0].starts_with("day,key,plan,partner,forwarded,upstream_2xx,"));
        assert!(!lines[0].contains("unauthorized") && lines[0].contains("quota_exhausted"));
        assert!(lines[1].starts_with("2025-11-26,k,basic,\"a,b\",4,3,0,0,1,"));
        let j = serde_json::to_value(row_view(20_418, "k", &r)).unwrap();
        assert_eq!(
            (j["forwarded"].as_u64(), j["rate_limited"].as_u64()),
            (Some(4), Some(2))
        );
        assert_eq!(j.as_object().unwrap().len(), header().len());
    }
}
