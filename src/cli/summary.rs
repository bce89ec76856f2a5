//! What `tollgate check` prints of a config it accepts: its listeners, edge, limits, plans
//! with their allow-lists and quotas, the ledger, tracing, keys, partners, the cluster, the
//! catalogue, and what is kept of the operators' changes.

use std::fmt::{self, Write as _};

use crate::config::routes::{Family, MethodSel, PathMatch};
use crate::config::{Allow, Config, Scheme};

/// What `check` says of partner upgrades, keys changed live and keys issued through the
/// admin API: where they are kept, those in force when the store can be read, and a warning
/// when they are kept nowhere. Refused, naming the field, when the file gives a key the name
/// or a digest of an issued one, or drops a plan or partner one is on (as a reload would be).
pub(super) fn overrides_summary(cfg: &Config) -> Result<String, crate::config::ConfigError> {
    let mut s = String::new();
    let read = match (&cfg.process.cluster, &cfg.process.state_path) {
        (Some(c), on_disk) => {
            let _ = writeln!(
                s,
                "  overrides     kept in the cluster's Redis ({})",
                c.redacted_url()
            );
            match (crate::keys::check::read_redis(c), on_disk) {
                // Redis not there: this replica's own copy says what it would start with.
                (Err(e), Some(p)) => {
                    let _ = writeln!(
                        s,
                        "  overrides     not read from Redis ({e}): this replica's copy in {} instead",
                        p.display()
                    );
                    crate::keys::check::read_copy(p).map_err(|e| e.to_string())
                }
                (read, _) => read.map_err(|e| e.to_string()),
            }
        }
        (None, Some(p)) => {
            let _ = writeln!(s, "  overrides     kept in {}", p.display());
            crate::keys::check::read_state(p).map_err(|e| e.to_string())
        }
        (None, None) => {
            let _ = writeln!(
                s,
                "warning: partner upgrades, keys changed live (suspend, revoke, limit, quota) and keys issued through the admin API (POST /api/keys) last until the process stops: set `state.path` (one process) or `cluster` (several)"
            );
            return Ok(s);
        }
    };
    match read {
        Ok(list) if list.is_empty() => {
            let _ = writeln!(s, "  overrides     none in force");
        }
        Ok(list) => {
            let issued: crate::policy::overrides::KeyRecords = list
                .iter()
                .filter_map(|o| Some((o.issued.as_ref()?.id, o.clone())))
                .collect();
            crate::policy::overrides::check_issued(cfg, &issued)?;
            if !issued.is_empty() {
                let _ = writeln!(
                    s,
                    "  issued keys   {} (through the admin API)",
                    issued.len()
                );
            }
            for o in crate::keys::check::upgrades(&list, &cfg.plans) {
                let _ = writeln!(
                    s,
                    "  override      {} on {} (plan_id {}; the YAML says {}) by {}",
                    o.key,
                    o.plan,
                    o.plan_id,
                    o.replaced,
                    o.partner.as_deref().unwrap_or("-")
                );
            }
            for o in &list {
                let mut changes = Vec::new();
                if let Some(c) = &o.revoked {
                    changes.push(format!("revoked by {}", c.by));
                }
                if let Some(c) = &o.suspended {
                    changes.push(format!("suspended by {}", c.by));
                }
                if let Some(l) = &o.limit {
                    changes.push(format!(
                        "limit {} by {}",
                        l.requests_per_window, l.change.by
                    ));
                }
                if let Some(q) = &o.quota {
                    changes.push(format!(
                        "quota {} per {} by {}",
                        q.quota.requests,
                        q.quota.per.as_str(),
                        q.change.by
                    ));
                }
                if !changes.is_empty() {
                    let _ = writeln!(s, "  key change    {}: {}", o.key, changes.join(", "));
                }
            }
        }
        Err(e) => {
            let _ = writeln!(s, "  overrides     not read: {e}");
        }
    }
    Ok(s)
}

/// A plan's calendar quota for [`summary`]: `; quota N / month`, or nothing.
fn quota_text(q: Option<&crate::config::QuotaSpec>) -> String {
    q.map_or(String::new(), |q| {
        format!("; quota {} / {}", q.requests, q.per.as_str())
    })
}

/// The `check` summary: one section after another, each a [`fmt::Display`] of its own.
pub(crate) struct Summary<'a>(pub(crate) &'a Config);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        write!(f, "{}", Listeners(cfg))?;
        write!(f, "{}", Edge(cfg))?;
        write!(f, "{}", Upstream(cfg))?;
        write!(f, "{}", Plans(cfg))?;
        write!(f, "{}", Ledger(cfg))?;
        write!(f, "{}", Traces(cfg))?;
        write!(f, "{}", Keys(cfg))?;
        write!(f, "{}", Routes(cfg))?;
        write!(f, "{}", Warnings(cfg))?;
        Ok(())
    }
}

/// The `check` summary as text.
pub fn summary(cfg: &Config) -> String {
    Summary(cfg).to_string()
}

/// The file, and where it listens: the listeners, shutdown and the runtime.
struct Listeners<'a>(&'a Config);

impl fmt::Display for Listeners<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        let mut s = String::new();
        let _ = writeln!(s, "{}: OK", cfg.source.display());
        let _ = writeln!(s, "  listen        {}", cfg.process.listen);
        if let Some(t) = &cfg.process.tls {
            let _ = writeln!(
                s,
                "  tls listen    {} (cert {})",
                t.listen,
                t.cert_file.display()
            );
        }
        let _ = writeln!(s, "  admin         {}", cfg.process.admin_listen);
        let sd = &cfg.process.shutdown;
        let _ = writeln!(
            s,
            "  shutdown      drain {} s, grace {} s, timeout {} s",
            sd.drain_seconds, sd.grace_seconds, sd.timeout_seconds
        );
        let rt = &cfg.process.runtime;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let _ = writeln!(
            s,
            "  runtime       {} thread{}{}, {}{}; upstream pool {} connections; {} accept loop{} per listener (run --conf replaces it)",
            rt.threads_for(cpus),
            if rt.threads_for(cpus) == 1 { "" } else { "s" },
            if rt.threads == 0 { " (one per CPU)" } else { "" },
            if rt.stealing_for(cpus) { "work stealing" } else { "no work stealing (a runtime per thread)" },
            if rt.work_stealing == crate::config::runtime::Stealing::Auto { " (auto: off for one thread, on for several)" } else { "" },
            rt.upstream_keepalive_pool_size,
            rt.listener_tasks_per_fd,
            if rt.listener_tasks_per_fd == 1 { "" } else { "s" },
        );
        f.write_str(&s)
    }
}

/// The edge: deadlines and caps, connections, auth failures, the cluster, the webhook guard.
struct Edge<'a>(&'a Config);

impl fmt::Display for Edge<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        let mut s = String::new();
        let e = &cfg.server;
        let _ = writeln!(
            s,
            "  edge          head {} s, idle {} s, body {} s, send {} s, TLS handshake {} s; heads ≤ {} bytes and {} fields; {} requests per connection",
            e.header_timeout.as_secs(),
            e.idle_timeout.as_secs(),
            e.body_timeout.as_secs(),
            e.send_timeout.as_secs(),
            e.tls_handshake_timeout.as_secs(),
            e.max_header_bytes,
            e.max_headers,
            e.max_requests_per_connection
        );
        let proxies = if e.trusted_proxies.is_empty() {
            "none".to_string()
        } else {
            let list: Vec<String> = e.trusted_proxies.iter().map(|n| n.to_string()).collect();
            list.join(", ")
        };
        let per_ip = e
            .max_connections_per_ip
            .map_or("no cap".to_string(), |n| format!("≤ {n}"));
        let _ = writeln!(
            s,
            "  connections   ≤ {} in all, {per_ip} per address; trusted proxies: {proxies}",
            e.max_connections
        );
        let _ = match &cfg.auth_failures {
            Some(a) => writeln!(
                s,
                "  auth failures {} in {} s block an address for {} s ({} addresses tracked)",
                a.max_failures,
                a.window.as_secs(),
                a.block.as_secs(),
                a.max_tracked_ips
            ),
            None => writeln!(s, "  auth failures off (no auth_failures block)"),
        };
        let _ = match &cfg.process.cluster {
            Some(c) => writeln!(
                s,
                "  cluster       budgets shared through {} (prefix `{}`), reconciled every {} ms, timeout {} ms",
                c.redacted_url(),
                c.key_prefix,
                c.sync_interval.as_millis(),
                c.timeout.as_millis()
            ),
            None => writeln!(s, "  cluster       off: budgets in this process (no cluster block)"),
        };
        let g = &cfg.webhook_guard;
        let _ = writeln!(
            s,
            "  webhook guard {}",
            if !g.enabled {
                "off".to_string()
            } else {
                format!(
                    "on ({}; exempt hosts: {})",
                    if g.allow_http {
                        "http and https"
                    } else {
                        "https only"
                    },
                    if g.allow_hosts.is_empty() {
                        "none".to_string()
                    } else {
                        g.allow_hosts.join(", ")
                    }
                )
            }
        );
        f.write_str(&s)
    }
}

/// The upstream and the limits' window and body caps.
struct Upstream<'a>(&'a Config);

impl fmt::Display for Upstream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        let mut s = String::new();
        let u = &cfg.upstream;
        let scheme = match u.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        let _ = writeln!(
            s,
            "  upstream      {scheme}://{}{} (connect {} ms, read {} ms{})",
            u.authority,
            u.base_path,
            u.connect_timeout.as_millis(),
            u.read_timeout.as_millis(),
            if u.ca_file.is_some() {
                ", private CA"
            } else {
                ""
            }
        );
        let l = &cfg.limits;
        let _ = writeln!(
            s,
            "  limits        window {} s; bodies ≤ {} bytes; checked bodies ≤ {} bytes",
            l.window, l.max_body_bytes, l.max_validated_body_bytes
        );
        f.write_str(&s)
    }
}

/// Each plan with its limit, allow-list and quota, and the partners' line.
struct Plans<'a>(&'a Config);

impl fmt::Display for Plans<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        let mut s = String::new();
        let l = &cfg.limits;
        let _ = writeln!(s, "  plans");
        for p in &cfg.plans {
            let allow = match &p.allow {
                Allow::All => "all".to_string(),
                Allow::Only(ids) => ids
                    .iter()
                    .map(|&i| cfg.catalogue.get(i).id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            let shadow = if p.shadow {
                "   SHADOW: refusals recorded, not enforced"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "    {:<10} plan_id {:<3} {:>5} requests / {} s   allow: {allow}{}{shadow}",
                p.name,
                p.plan_id,
                p.limit,
                l.window,
                quota_text(p.quota.as_ref()),
            );
        }
        let _ = writeln!(
            s,
            "    {:<10} {:<11} {:>5} requests / {} s{}",
            "(partners)",
            "",
            cfg.partner_limit,
            l.window,
            quota_text(cfg.partner_quota.as_ref()),
        );
        f.write_str(&s)
    }
}

/// The ledger: on or off.
struct Ledger<'a>(&'a Config);

impl fmt::Display for Ledger<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        let mut s = String::new();
        let _ = match &cfg.ledger {
            Some(lg) => writeln!(
                s,
                "  ledger        every request counted per key and UTC day, {} days kept",
                lg.retention_days
            ),
            None => writeln!(s, "  ledger        off (no ledger block)"),
        };
        f.write_str(&s)
    }
}

/// Traces: where the spans go, in which encoding, and how many new traces are recorded.
struct Traces<'a>(&'a Config);

impl fmt::Display for Traces<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.process.tracing {
            Some(t) => writeln!(
                f,
                "  tracing       spans to {} ({}), service `{}`; new traces recorded at ratio {} (a valid traceparent's flag decides its own)",
                t.traces_url,
                t.protocol.as_str(),
                t.service_name,
                t.sample_ratio.get()
            ),
            None => writeln!(f, "  tracing       off (no tracing block)"),
        }
    }
}

/// The keys, by kind and plan, counted (a config may hold a million).
struct Keys<'a>(&'a Config);

impl fmt::Display for Keys<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        let mut s = String::new();
        let managed = cfg.keys.iter().filter(|k| k.partner.is_some()).count();
        let _ = writeln!(
            s,
            "  keys          {} customer ({managed} managed by a partner), {} partner",
            cfg.keys.len(),
            cfg.partners.len()
        );
        // Keys that change with time or have limits of their own: counted, never listed one by one
        // (a config may hold a million keys).
        let extras: Vec<&crate::config::KeyExtra> =
            cfg.keys.iter().filter_map(|k| k.extra.as_deref()).collect();
        if !extras.is_empty() {
            let count = |f: &dyn Fn(&crate::config::KeyExtra) -> bool| {
                extras.iter().filter(|e| f(e)).count()
            };
            let _ = writeln!(
                s,
                "                {} with an expiry, {} rotating (a previous digest), {} with a limit of their own, {} with a quota of their own",
                count(&|e| e.expires_ms.is_some()),
                count(&|e| !e.previous.is_empty()),
                count(&|e| e.limit.is_some()),
                count(&|e| e.quota.is_some()),
            );
        }
        for p in &cfg.plans {
            let n = cfg
                .keys
                .iter()
                .filter(|k| cfg.plans[k.plan].name == p.name)
                .count();
            let _ = writeln!(s, "    {:<10} {n}", p.name);
        }
        f.write_str(&s)
    }
}

/// The catalogue's routes.
struct Routes<'a>(&'a Config);

impl fmt::Display for Routes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        let mut s = String::new();
        let routes = cfg.catalogue.routes();
        let source = match &cfg.routes_file {
            Some(f) => f.display().to_string(),
            None => "built-in".to_string(),
        };
        let _ = writeln!(
            s,
            "  routes        {} from {source} (* = path assumed, not shown in the spec)",
            routes.len() - 1
        );
        for r in &routes[..routes.len() - 1] {
            let method = match &r.method {
                MethodSel::Any => "any",
                MethodSel::One(m) => m.as_str(),
            };
            let path = match &r.path {
                PathMatch::Exact(p) => p.clone(),
                PathMatch::Prefix(p) => format!("{p}*"),
            };
            let family = match r.family {
                Family::Customer => "customer",
                Family::Partner => "partner",
            };
            let body = r
                .body
                .map(|b| format!(" body={}", b.name()))
                .unwrap_or_default();
            // What a 2xx does at the edge, when the route has an effect other than its body's
            // usual one (an upgrade for `service_upgrade`).
            let effect = match (r.effect, r.body) {
                (None, _)
                | (
                    Some(crate::config::routes::Effect::Upgrade),
                    Some(crate::config::routes::BodyRule::ServiceUpgrade),
                ) => String::new(),
                (Some(e), _) => format!(
                    " effect={}",
                    crate::policy::overrides::ChangeKind::of_effect(e)
                        .as_str()
                        .trim_start_matches("partner_")
                ),
            };
            let key_field = r
                .key_field
                .as_deref()
                .map(|f| format!(" key_field={f}"))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "    {}{:<24} {:<7} {:<34} {family}{body}{effect}{key_field}",
                if r.assumed { "*" } else { " " },
                r.id,
                method,
                path
            );
        }
        let _ = writeln!(
            s,
            "     {:<24} {:<7} {:<34} customer, `allow: all` plans only",
            "unknown", "any", "/v2/* (uncatalogued)"
        );
        f.write_str(&s)
    }
}

/// The config's warnings, each with its file, line and field.
struct Warnings<'a>(&'a Config);

impl fmt::Display for Warnings<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cfg = self.0;
        let mut s = String::new();
        if !cfg.warnings.is_empty() {
            let _ = writeln!(s, "warnings");
            for w in &cfg.warnings {
                let line = w.line.map(|l| format!(":{l}")).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "  {}{line}: field `{}`: {}",
                    cfg.source.display(),
                    w.field,
                    w.message
                );
            }
        }
        f.write_str(&s)
    }
}
