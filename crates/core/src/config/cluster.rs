//! The `cluster` block: budgets shared across replicas through Redis (or Valkey).

use std::fmt;
use std::time::Duration;

use super::file::FileCluster;
use super::{Env, Invalid};

/// Shortest and longest `sync_interval_ms`: below 10 ms the exchanges cost more than they
/// save; above a minute a window would pass between two.
const SYNC_MS: (u64, u64) = (10, 60_000);
/// Bounds of `timeout_ms`.
const TIMEOUT_MS: (u64, u64) = (1, 60_000);
const MAX_PREFIX: usize = 64;

/// Where and how often the replicas reconcile their budgets. (It serializes, for comparing two
/// configs only: never to a log or a page, which take [`Cluster::redacted_url`].)
#[derive(Clone, PartialEq, Eq, serde::Serialize)]
pub struct Cluster {
    /// `redis://`, `rediss://`, or `redis+sentinel://` / `rediss+sentinel://` ([`SentinelUrl`]),
    /// as written: it may hold a password, so it is never printed (see
    /// [`Cluster::redacted_url`]); `Debug` redacts it too.
    pub redis_url: String,
    /// What every name this fleet writes in Redis starts with.
    pub key_prefix: String,
    /// How often each replica exchanges its budgets with Redis (`cluster.sync_interval_ms`).
    pub sync_interval: Duration,
    /// The longest one exchange with Redis may take (connect, or answer), and the longest a
    /// request whose key has no lease on this replica waits for one.
    pub timeout: Duration,
}

impl Cluster {
    /// The URL with any password replaced by `***`, for logs, `check` and pages.
    pub fn redacted_url(&self) -> String {
        redact(&self.redis_url)
    }
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("redis_url", &self.redacted_url())
            .field("key_prefix", &self.key_prefix)
            .field("sync_interval", &self.sync_interval)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A `redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT]/MASTER_NAME[/DB]` URL: Redis
/// behind Sentinel. The Sentinels are asked where the master named `MASTER_NAME` is; the
/// user and password are the master's (Sentinels are reached without them);
/// `rediss+sentinel://` reaches the master over TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The Sentinels, `host:port`.
    pub sentinels: Vec<String>,
    /// The master's name, as the Sentinels monitor it.
    pub master: String,
    /// The database number (0 when not given).
    pub db: u16,
    /// Whether the master is reached over TLS (`rediss+sentinel://`).
    pub tls: bool,
    /// `USER:PASSWORD` as written, when given.
    pub userinfo: Option<String>,
}

impl SentinelUrl {
    /// `url` parsed, or `None` when it does not name Sentinels; `Err` says what is wrong.
    pub fn parse(url: &str) -> Option<Result<Self, String>> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("redis+sentinel://") {
            (false, r)
        } else {
            (true, url.strip_prefix("rediss+sentinel://")?)
        };
        Some(Self::parse_rest(tls, rest))
    }

    fn parse_rest(tls: bool, rest: &str) -> Result<Self, String> {
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()), h),
            None => (None, authority),
        };
        let mut sentinels = Vec::new();
        for h in hosts.split(',') {
            let port = h
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            match port {
                Some((host, Ok(p))) if !host.is_empty() && p > 0 => sentinels.push(h.to_string()),
                _ => {
                    return Err(format!(
                        "`{h}` is not a Sentinel's HOST:PORT; write redis+sentinel://HOST:PORT[,HOST:PORT]/MASTER_NAME/DB"
                    ))
                }
            }
        }
        let mut parts = path.split('/');
        let master = parts.next().unwrap_or_default();
        if master.is_empty() {
            return Err("names no master; write redis+sentinel://HOST:PORT/MASTER_NAME/DB".into());
        }
        let db = match parts.next() {
            None | Some("") => 0,
            Some(db) => db.parse::<u16>().map_err(|_| {
                format!("the path `/{master}/{db}` does not end in a database number")
            })?,
        };
        if parts.next().is_some_and(|p| !p.is_empty()) {
            return Err(format!("the path `/{path}` is not /MASTER_NAME/DB"));
        }
        Ok(Self {
            sentinels,
            master: master.to_string(),
            db,
            tls,
            userinfo,
        })
    }

    /// The master's URL once its address is known (`redis://` or `rediss://`, the user, the
    /// password and the database of this URL).
    pub fn node_url(&self, addr: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match &self.userinfo {
            Some(u) => format!("{scheme}://{u}@{addr}/{}", self.db),
            None => format!("{scheme}://{addr}/{}", self.db),
        }
    }
}

/// `url` (`redis://` or `rediss://`) with its host and port those of `addr` (`host:port`):
/// another node of the same Redis Cluster, with the same credentials and database.
pub fn at_address(url: &str, addr: &str) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    let mut u = url::Url::parse(url).ok()?;
    u.set_host(Some(host)).ok()?;
    u.set_port(Some(port.parse().ok()?)).ok()?;
    Some(u.to_string())
}

/// The user information of `url` (what comes before the `@` of its authority), read without
/// parsing the rest (a Sentinel URL lists several hosts, which no URL parser takes).
fn userinfo(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    authority.rsplit_once('@').map(|(u, _)| u)
}

/// `url` with its password (and a user name given alone, which Redis takes as a password)
/// replaced by `***`.
pub fn redact(url: &str) -> String {
    if SentinelUrl::parse(url).is_some() {
        return match userinfo(url) {
            Some(u) => url.replacen(&format!("{u}@"), "***@", 1),
            None => url.to_string(),
        };
    }
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            } else if !u.username().is_empty() {
                let _ = u.set_username("***");
            }
            u.to_string()
        }
        Err(_) => "(not a URL)".into(),
    }
}

/// `text` with the password (or lone user name) of `url` replaced by `***`: for a driver's
/// error message that might repeat it.
pub fn scrub(text: &str, url: &str) -> String {
    if SentinelUrl::parse(url).is_some() {
        let secret = userinfo(url)
            .map(|u| u.split_once(':').map_or(u, |(_, p)| p))
            .filter(|s| !s.is_empty());
        return match secret {
            Some(s) => text.replace(s, "***"),
            None => text.to_string(),
        };
    }
    let Ok(u) = url::Url::parse(url) else {
        return text.to_string();
    };
    let secret = u
        .password()
        .filter(|p| !p.is_empty())
        .or_else(|| Some(u.username()).filter(|n| !n.is_empty()));
    match secret {
        Some(s) => text.replace(s, "***"),
        None => text.to_string(),
    }
}

pub(super) fn cluster(f: &FileCluster, env: &dyn Env) -> Result<Cluster, Invalid> {
    let redis_url = match (&f.redis_url, &f.redis_url_env) {
        (Some(u), None) => u.clone(),
        (None, Some(var)) => env.var(var).ok_or_else(|| {
            Invalid::new(
                "cluster.redis_url_env",
                format!("the variable `{var}` is not set"),
            )
        })?,
        _ => {
            return Err(Invalid::new(
                "cluster.redis_url",
                "write exactly one of `redis_url` and `redis_url_env`",
            ))
        }
    };
    let sentinel = SentinelUrl::parse(&redis_url)
        .transpose()
        .map_err(|e| Invalid::new("cluster.redis_url", e))?;
    if sentinel.is_none() {
        check_url(&redis_url)?;
    }
    let p = &f.key_prefix;
    if p.is_empty()
        || p.len() > MAX_PREFIX
        || !p
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b))
    {
        return Err(Invalid::new(
            "cluster.key_prefix",
            format!("must be 1 to {MAX_PREFIX} characters of A-Z a-z 0-9 _ - . :"),
        ));
    }
    let ms = |v: u64, field: &str, (lo, hi): (u64, u64)| {
        if (lo..=hi).contains(&v) {
            Ok(Duration::from_millis(v))
        } else {
            Err(Invalid::new(
                field,
                format!("{v} is outside {lo}..={hi} (milliseconds)"),
            ))
        }
    };
    Ok(Cluster {
        redis_url,
        key_prefix: p.clone(),
        sync_interval: ms(f.sync_interval_ms, "cluster.sync_interval_ms", SYNC_MS)?,
        timeout: ms(f.timeout_ms, "cluster.timeout_ms", TIMEOUT_MS)?,
    })
}

/// A `redis://` or `rediss://` URL with a host and, if any, a database number.
fn check_url(redis_url: &str) -> Result<(), Invalid> {
    let url = url::Url::parse(redis_url).map_err(|e| {
        Invalid::new(
            "cluster.redis_url",
            format!("not a URL ({e}); write redis://host:6379/0 or rediss://host:6380/0"),
        )
    })?;
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(Invalid::new(
            "cluster.redis_url",
            format!(
                "the scheme `{}` is not `redis`, `rediss` or `redis+sentinel`",
                url.scheme()
            ),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Invalid::new("cluster.redis_url", "has no host"));
    }
    let db = url.path().trim_start_matches('/');
    if !db.is_empty() && db.parse::<u16>().is_err() {
        return Err(Invalid::new(
            "cluster.redis_url",
            format!("the path `/{db}` is not a database number"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Vars;
    impl Env for Vars {
        fn var(&self, name: &str) -> Option<String> {
            (name == "REDIS_URL").then(|| "redis://:from-env@h:6379".to_string())
        }
    }

    fn cluster(f: &FileCluster) -> Result<Cluster, Invalid> {
        super::cluster(f, &Vars)
    }

    fn file(url: &str) -> FileCluster {
        FileCluster {
            redis_url: Some(url.into()),
            redis_url_env: None,
            key_prefix: "tollgate".into(),
            sync_interval_ms: 100,
            timeout_ms: 100,
        }
    }

    #[test]
    fn a_redis_or_rediss_url_with_a_host_is_accepted() {
        for url in [
            "redis://127.0.0.1:6379/0",
            "rediss://cache.internal:6380",
            "redis://:pw@h/3",
        ] {
            let c = cluster(&file(url)).unwrap();
            assert_eq!(c.sync_interval, Duration::from_millis(100));
        }
    }

    #[test]
    fn other_urls_are_refused_with_the_field() {
        for (url, says) in [
            ("http://127.0.0.1:6379", "scheme `http`"),
            ("127.0.0.1:6379", "not a URL"),
            ("redis:///0", "no host"),
            ("redis://h/zero", "not a database number"),
        ] {
            let e = cluster(&file(url)).unwrap_err();
            assert_eq!(e.field, "cluster.redis_url");
            assert!(e.message.contains(says), "{url}: {}", e.message);
        }
    }

    #[test]
    fn a_sentinel_url_names_its_sentinels_master_and_database() {
        let c = cluster(&file("redis+sentinel://:pw@10.0.0.1:26379,s2:26380/tg/3")).unwrap();
        let s = SentinelUrl::parse(&c.redis_url).unwrap().unwrap();
        assert_eq!(s.sentinels, ["10.0.0.1:26379", "s2:26380"]);
        assert_eq!((s.master.as_str(), s.db, s.tls), ("tg", 3, false));
        assert_eq!(s.node_url("10.0.0.9:6379"), "redis://:pw@10.0.0.9:6379/3");
        let s = SentinelUrl::parse("rediss+sentinel://h:1/m")
            .unwrap()
            .unwrap();
        assert_eq!(
            (s.db, s.tls, s.node_url("a:2")),
            (0, true, "rediss://a:2/0".into())
        );
        assert!(SentinelUrl::parse("redis://h:1").is_none());
        for (url, says) in [
            ("redis+sentinel://h/tg/0", "HOST:PORT"),
            ("redis+sentinel://h:1,:2/tg", "HOST:PORT"),
            ("redis+sentinel://h:0/tg", "HOST:PORT"),
            ("redis+sentinel://h:1", "no master"),
            ("redis+sentinel://h:1/tg/x", "database number"),
            ("redis+sentinel://h:1/tg/0/more", "not /MASTER_NAME/DB"),
        ] {
            let e = cluster(&file(url)).unwrap_err();
            assert_eq!(e.field, "cluster.redis_url");
            assert!(e.message.contains(says), "{url}: {}", e.message);
        }
    }

    #[test]
    fn a_sentinel_urls_password_never_shows() {
        let url = "redis+sentinel://user:s3cret@h1:1,h2:2/tg/0";
        assert_eq!(redact(url), "redis+sentinel://***@h1:1,h2:2/tg/0");
        assert_eq!(
            scrub("auth failed: s3cret", url),
            "auth failed: ***",
            "the password, not the user"
        );
        assert_eq!(
            redact("redis+sentinel://h1:1/tg"),
            "redis+sentinel://h1:1/tg"
        );
    }

    #[test]
    fn prefix_and_intervals_are_bounded() {
        let mut f = file("redis://h");
        f.key_prefix = "a b".into();
        assert_eq!(cluster(&f).unwrap_err().field, "cluster.key_prefix");
        let mut f = file("redis://h");
        f.sync_interval_ms = 5;
        assert_eq!(cluster(&f).unwrap_err().field, "cluster.sync_interval_ms");
        let mut f = file("redis://h");
        f.timeout_ms = 0;
        assert_eq!(cluster(&f).unwrap_err().field, "cluster.timeout_ms");
    }

    #[test]
    fn the_url_may_come_from_the_environment() {
        let mut f = file("redis://h");
        f.redis_url = None;
        f.redis_url_env = Some("REDIS_URL".into());
        assert_eq!(cluster(&f).unwrap().redis_url, "redis://:from-env@h:6379");
        f.redis_url_env = Some("UNSET".into());
        assert_eq!(cluster(&f).unwrap_err().field, "cluster.redis_url_env");
        f.redis_url = Some("redis://h".into());
        f.redis_url_env = Some("REDIS_URL".into());
        assert_eq!(cluster(&f).unwrap_err().field, "cluster.redis_url");
    }

    #[test]
    fn passwords_never_show() {
        let c = cluster(&file("redis://user:s3cret@h:6379/0")).unwrap();
        assert!(!c.redacted_url().contains("s3cret"));
        assert!(!format!("{c:?}").contains("s3cret"));
        assert_eq!(redact("redis://:s3cret@h"), "redis://:***@h");
        assert_eq!(redact("redis://s3cret@h"), "redis://***@h");
        assert_eq!(redact("rediss://h:6380/1"), "rediss://h:6380/1");
    }
}
