//! `tollgate keys`: a client of the admin listener's key API for operators and scripts. The
//! admin token, if the listener needs one, is read from `TOLLGATE_ADMIN_TOKEN`. A table by
//! default, the API's JSON with `--json`; exit 0 on success, 1 with the problem's `detail` on
//! stderr otherwise.

use std::io::Read as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::admin_client::{list_all, segment, Client};

/// `tollgate keys …`.
#[derive(Args, Debug)]
pub struct KeysArgs {
    /// The admin listener, http://host:port.
    #[arg(long, global = true, default_value = "http://127.0.0.1:9091")]
    admin: String,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// Every key (every page), in name order, filtered.
    List {
        /// Only keys of this plan (`partner` for partner keys).
        #[arg(long)]
        plan: Option<String>,
        /// Only keys this partner manages (and the partner's own).
        #[arg(long)]
        partner: Option<String>,
        /// Only keys in this state: active, expired, suspended or revoked.
        #[arg(long)]
        state: Option<String>,
        /// Only keys from this source: config (the YAML) or api (issued).
        #[arg(long)]
        source: Option<String>,
    },
    /// Issue a key: the gateway draws its secret and prints it this once (none with
    /// `--sha256`).
    Create {
        /// The key's name.
        name: String,
        /// The plan it is on (a plan's name).
        #[arg(long)]
        plan: String,
        /// The partner that manages it (a partner's name).
        #[arg(long)]
        partner: Option<String>,
        /// When it expires (RFC 3339, in the future).
        #[arg(long)]
        expires_at: Option<String>,
        /// Its own window limit (requests per window).
        #[arg(long)]
        requests_per_window: Option<u32>,
        /// Its own quota: N/day or N/month.
        #[arg(long, value_parser = quota_arg)]
        quota: Option<(u64, String)>,
        /// The SHA-256 of a secret you keep (64 hex): the gateway draws none.
        #[arg(long)]
        sha256: Option<String>,
    },
    /// A new secret for an issued key, printed this once; the one it replaces still
    /// authenticates for the overlap.
    Rotate {
        /// The key's name.
        name: String,
        /// Seconds the replaced secret still authenticates (default 86400; 0: none).
        #[arg(long)]
        overlap: Option<u64>,
    },
    /// Revoke an issued key and forget it (its ledger rows stay).
    Delete {
        /// The key's name.
        name: String,
    },
    /// One key's state.
    Show {
        /// The key's name.
        name: String,
    },
    /// Refuse the key until it is resumed.
    Suspend {
        /// The key's name.
        name: String,
        /// Why, in the operator's words (kept with the change).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Lift a suspension.
    Resume {
        /// The key's name.
        name: String,
    },
    /// Refuse every digest of the key for good.
    Revoke {
        /// The key's name.
        name: String,
    },
    /// Set the key's own window limit, or clear it (back to its plan's).
    Limit {
        /// The key's name.
        name: String,
        /// Requests per window.
        #[arg(required_unless_present = "clear", conflicts_with = "clear")]
        requests: Option<u32>,
        /// Clear the key's own limit.
        #[arg(long)]
        clear: bool,
    },
    /// Set the key's own quota (N/day or N/month), or clear it (back to its plan's).
    Quota {
        /// The key's name.
        name: String,
        /// N/day or N/month.
        #[arg(required_unless_present = "clear", conflicts_with = "clear", value_parser = quota_arg)]
        quota: Option<(u64, String)>,
        /// Clear the key's own quota.
        #[arg(long)]
        clear: bool,
    },
    /// Revoke the key whose secret is read on stdin (a leak: the name need not be known).
    RevokeSecret,
}

/// `N/day` or `N/month`.
fn quota_arg(s: &str) -> Result<(u64, String), String> {
    let (n, per) = s
        .split_once('/')
        .ok_or_else(|| format!("`{s}`: write N/day or N/month"))?;
    let n = n
        .parse()
        .map_err(|_| format!("`{n}` is not a whole number"))?;
    match per {
        "day" | "month" => Ok((n, per.to_string())),
        _ => Err(format!("`{per}`: the period is day or month")),
    }
}

/// `tollgate keys …`.
pub(super) fn run(args: KeysArgs) -> ExitCode {
    let c = Client::new(&args.admin);
    let key = |name: &str, op: &str| format!("/api/keys/{}/{op}", segment(name));
    let answer = match &args.verb {
        Verb::List {
            plan,
            partner,
            state,
            source,
        } => list_all(
            &c,
            &[
                ("plan", plan),
                ("partner", partner),
                ("state", state),
                ("source", source),
            ],
        ),
        Verb::Create {
            name,
            plan,
            partner,
            expires_at,
            requests_per_window,
            quota,
            sha256,
        } => {
            let mut body = json!({ "name": name, "plan": plan });
            let mut put = |k: &str, v: Value| {
                if !v.is_null() {
                    body[k] = v;
                }
            };
            put("partner", json!(partner));
            put("expires_at", json!(expires_at));
            put("requests_per_window", json!(requests_per_window));
            put("sha256", json!(sha256));
            if let Some((n, per)) = quota {
                put("quota", json!({ "requests": n, "per": per }));
            }
            c.call("POST", "/api/keys", Some(&body))
        }
        Verb::Rotate { name, overlap } => {
            let body = overlap.map_or(json!({}), |s| json!({ "overlap_seconds": s }));
            c.call("POST", &key(name, "rotate"), Some(&body))
        }
        // 204, no body: `--json` prints nothing, as the API answers nothing.
        Verb::Delete { name } => c.call("DELETE", &format!("/api/keys/{}", segment(name)), None),
        Verb::Show { name } => c.call("GET", &format!("/api/keys/{}", segment(name)), None),
        Verb::Suspend { name, reason } => {
            let body = reason.as_ref().map(|r| json!({ "reason": r }));
            c.call(
                "POST",
                &key(name, "suspend"),
                Some(&body.unwrap_or(json!({}))),
            )
        }
        Verb::Resume { name } => c.call("POST", &key(name, "resume"), None),
        Verb::Revoke { name } => c.call("POST", &key(name, "revoke"), None),
        Verb::Limit {
            name, clear: true, ..
        } => c.call("DELETE", &key(name, "limit"), None),
        Verb::Limit { name, requests, .. } => c.call(
            "PUT",
            &key(name, "limit"),
            Some(&json!({ "requests_per_window": requests })),
        ),
        Verb::Quota {
            name, clear: true, ..
        } => c.call("DELETE", &key(name, "quota"), None),
        Verb::Quota { name, quota, .. } => {
            let (n, per) = quota.clone().unwrap_or_default();
            c.call(
                "PUT",
                &key(name, "quota"),
                Some(&json!({ "requests": n, "per": per })),
            )
        }
        Verb::RevokeSecret => {
            let mut secret = String::new();
            match std::io::stdin().read_to_string(&mut secret) {
                Ok(_) => c.call(
                    "POST",
                    "/api/keys/revoke",
                    Some(&json!({ "key": secret.trim() })),
                ),
                Err(e) => Err(format!("could not read the secret on stdin: {e}")),
            }
        }
    };
    match answer {
        Ok(v) if args.json => {
            if !v.is_null() {
                println!("{v}");
            }
            ExitCode::SUCCESS
        }
        Ok(v) => {
            if let Verb::Delete { name } = &args.verb {
                println!("deleted {name}");
            } else if let (Verb::RevokeSecret, Some(name)) = (&args.verb, v["name"].as_str()) {
                // The API answers only the name (and the state) of the key the secret was.
                println!("revoked {name}");
            } else {
                print!("{}", table(&v));
            }
            if let Some(secret) = v["key"].as_str() {
                // Shown this once: the gateway keeps only its digest.
                println!("key: {secret}");
            }
            ExitCode::SUCCESS
        }
        Err(detail) => {
            eprintln!("error: {detail}");
            ExitCode::FAILURE
        }
    }
}

/// Keys as a table: a list's `keys`, or the one key an answer is.
fn table(v: &Value) -> String {
    let one = [v.clone()];
    let keys: &[Value] = match v["keys"].as_array() {
        Some(k) => k,
        None => &one,
    };
    let text = |k: &Value, f: &str| match &k[f] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let quota = |k: &Value| match &k["quota"] {
        Value::Null => "-".to_string(),
        q => format!("{}/{} ({} used)", q["requests"], text(q, "per"), q["used"]),
    };
    let mut rows = vec![[
        "NAME", "PLAN", "PARTNER", "STATE", "LIMIT", "QUOTA", "SOURCE",
    ]
    .map(String::from)];
    for k in keys {
        rows.push([
            text(k, "name"),
            text(k, "plan"),
            text(k, "partner"),
            text(k, "state"),
            text(k, "requests_per_window"),
            quota(k),
            text(k, "source"),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_is_n_per_day_or_month() {
        assert_eq!(quota_arg("500/day"), Ok((500, "day".into())));
        assert_eq!(quota_arg("7/month"), Ok((7, "month".into())));
        for bad in ["500", "x/day", "5/week", "/day"] {
            assert!(quota_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_print_as_a_table_one_row_each() {
        let v = json!({"keys": [
            {"name": "basic-1", "plan": "basic", "partner": null, "state": "active",
             "requests_per_window": 40, "quota": null, "source": "config"},
            {"name": "acme-customer", "plan": "basic", "partner": "acme", "state": "suspended",
             "requests_per_window": 40, "source": "config",
             "quota": {"requests": 100, "per": "day", "used": 3}}
        ], "next": null});
        let t = table(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("NAME"));
        assert!(lines[1].starts_with("basic-1  "));
        assert!(lines[2].contains("100/day (3 used)") && lines[2].contains("suspended"));
        assert_eq!(table(&v["keys"][0]).lines().count(), 2, "one key: one row");
    }
}
