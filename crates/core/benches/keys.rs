//! Key-table scale: load time and resident memory of the config + key table for N keys.
//!
//! For each N it writes a config with N customer keys (`sha256:` digests of distinct keys,
//! realistic 12-character names, three plans, one key in twenty managed by a partner) to a
//! temporary directory — generation is not timed — and then measures in a **fresh child
//! process** (this binary re-executed with `--measure FILE N`), so every measurement starts
//! from a clean heap:
//!
//! - `load`: `Config::load` (read, YAML parse, validation of every entry);
//! - `build`: `Policy::new` (the key table, from scratch);
//! - `reload`: `Config::load` + `Policy::new(new, Some(&old))` of the same file again while the
//!   first policy is live, carrying every key's rate state over (what SIGHUP does);
//! - `RSS`: `VmRSS` from `/proc/self/status` after load + build, with the policy alive;
//!   `HWM`: `VmHWM`, the peak RSS during load + build (before the reload);
//! - `B/key`: RSS over the N = 0 run, per key; `heap B/key`: live heap bytes (counted by the
//!   global allocator below) over the N = 0 run, per key; `allocs/key`: allocations made by
//!   load + build, per key;
//! - `lookup hit / miss`: ns per `KeyTable::lookup` (the request path's step 1 after hashing
//!   the token) of 200 000 digests of present keys in a scattered order, and of absent ones.
//!
//! Times are the median of `KEYSCALE_RUNS` child runs (default 3); memory figures are from the
//! run with the median total time. Sizes can be chosen with `KEYSCALE_SIZES=0,1000,100000`, and
//! the way the key list is written with `KEYSCALE_STYLE`: `flow` (default, one
//! `{ name: …, sha256: "…", plan: … }` per line), `block` (one field per line), `json`
//! (`{"name":"…",…}` per line), `crlf` (flow with Windows line ends) — all in the subset
//! `crates/core/src/config/fast.rs` reads — or `array` (`keys: [ {…}, {…} ]` over many lines, as a JSON
//! dump has it: outside the subset, so serde_yaml reads it; the slow path, for comparison).
//!
//! Run (release profile): `cargo bench -p tollgate-core --bench keys`
//!
//! `cargo bench -p tollgate-core --bench keys -- --generate N FILE` only writes the config with N keys (for a
//! profiler: `target/release/deps/keys-* --measure FILE N` is one measurement).
//!
//! `cargo bench -p tollgate-core --bench keys -- --phases` also times, for the largest N, the pieces of
//! `Config::load` one by one (reading the file, serde_yaml into the file structs, a bare
//! yaml_rust2 event walk — the floor of a line lookup, which only an error or warning needs)
//! to show where the parse time goes.

// The counting allocator below implements `GlobalAlloc`, which is `unsafe` by definition: it
// only forwards to `System` and counts. The core's library itself denies `unsafe`. The bench
// times with the system's clock by design (the core's clippy.toml keeps it out of the library).
#![allow(unsafe_code, clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tollgate_core::config::Config;
use tollgate_core::digest::Digest;
use tollgate_core::policy::Policy;

/// Counts live and peak heap bytes and the number of allocations.
///
/// The measuring child is single-threaded while it counts, so plain relaxed loads and stores
/// (no read-modify-write instructions) are exact and keep the allocator's cost unchanged.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

fn grew(by: usize) {
    let live = LIVE.load(Ordering::Relaxed) + by;
    LIVE.store(live, Ordering::Relaxed);
    if live > PEAK.load(Ordering::Relaxed) {
        PEAK.store(live, Ordering::Relaxed);
    }
}

fn shrank(by: usize) {
    LIVE.store(
        LIVE.load(Ordering::Relaxed).wrapping_sub(by),
        Ordering::Relaxed,
    );
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            ALLOCS.store(ALLOCS.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            ALLOCS.store(ALLOCS.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            ALLOCS.store(ALLOCS.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const DEFAULT_SIZES: &[usize] = &[0, 1_000, 100_000, 1_000_000];

/// The config around the keys: three plans, two partners (given by digest).
fn header() -> String {
    let mut s = String::from(
        r#"listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
upstream: { base_url: "http://127.0.0.1:9" }
plans:
  basic:
    plan_id: 1
    requests_per_window: 40
    allow: [send_message, send_group, send_group_event, group_list, client]
  standard: { plan_id: 2, requests_per_window: 70, allow: all }
  pro: { plan_id: 3, requests_per_window: 150, allow: all }
partners:
"#,
    );
    for p in ["acme", "globex"] {
        let d = Digest::of(format!("{p}-partner-key").as_bytes()).to_hex();
        let _ = writeln!(s, "  - {{ name: {p}, sha256: \"{d}\" }}");
    }
    s.push_str("keys:\n");
    s
}

/// How the key list is written (`KEYSCALE_STYLE`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Style {
    /// `  - { name: shop-0000001, sha256: "…", plan: pro }` (the fast reader's subset)
    Flow,
    /// `  - name: shop-0000001` / `    sha256: "…"` / `    plan: pro` (also the subset)
    Block,
    /// `  - {"name":"shop-0000001","sha256":"…","plan":"pro"}` (as `jq -c` writes; the subset)
    Json,
    /// Flow, with Windows line ends (the subset)
    Crlf,
    /// `keys: [` then `{"name": "shop-0000001", …},` per line then `]`, as a JSON dump has it:
    /// outside the subset, so serde_yaml reads it (the slow path, for comparison).
    Array,
}

impl Style {
    fn from_env() -> Self {
        match std::env::var("KEYSCALE_STYLE").as_deref() {
            Err(_) | Ok("flow") => Style::Flow,
            Ok("block") => Style::Block,
            Ok("json") => Style::Json,
            Ok("crlf") => Style::Crlf,
            Ok("array") => Style::Array,
            Ok(other) => {
                panic!("KEYSCALE_STYLE: `{other}` is not flow, block, json, crlf or array")
            }
        }
    }
}

/// A config with `n` distinct keys named `shop-0000000` …
fn generate(n: usize, style: Style) -> String {
    let mut s = header();
    s.reserve(n * 110);
    if n == 0 {
        s.truncate(s.len() - "keys:\n".len());
        return s;
    }
    if style == Style::Array {
        s.truncate(s.len() - "\n".len());
        s.push_str(" [\n");
    }
    for i in 0..n {
        let d = Digest::of(format!("key-{i}").as_bytes()).to_hex();
        let plan = ["basic", "standard", "pro"][i % 3];
        let partner = i % 20 == 7;
        let _ =
            match style {
                Style::Flow | Style::Crlf => write!(
                    s,
                    "  - {{ name: shop-{i:07}, sha256: \"{d}\", plan: {plan}{} }}{}",
                    if partner { ", partner: acme" } else { "" },
                    if style == Style::Crlf { "\r\n" } else { "\n" }
                ),
                Style::Block => writeln!(
                    s,
                    "  - name: shop-{i:07}\n    sha256: \"{d}\"\n    plan: {plan}{}",
                    if partner { "\n    partner: acme" } else { "" }
                ),
                Style::Json => writeln!(
                    s,
                    "  - {{\"name\":\"shop-{i:07}\",\"sha256\":\"{d}\",\"plan\":\"{plan}\"{}}}",
                    if partner { ",\"partner\":\"acme\"" } else { "" }
                ),
                Style::Array => writeln!(
                s,
                "  {{\"name\": \"shop-{i:07}\", \"sha256\": \"{d}\", \"plan\": \"{plan}\"{}}}{}",
                if partner { ", \"partner\": \"acme\"" } else { "" },
                if i + 1 < n { "," } else { "" }
            ),
            };
    }
    if style == Style::Array {
        s.push_str("]\n");
    }
    s
}

/// `VmRSS` and `VmHWM` of this process, in bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// One measurement, as the child reports it (`key=value` pairs on one line).
#[derive(Clone, Debug, Default)]
struct Sample {
    rss_before: u64,
    load: f64,
    build: f64,
    rss_after: u64,
    hwm: u64,
    heap: u64,
    heap_peak: u64,
    allocs: u64,
    reload: f64,
    hwm_reload: u64,
    /// ns per `KeyTable::lookup` of a present digest, and of an absent one, in random order.
    hit_ns: f64,
    miss_ns: f64,
    /// Heap bytes per key once every key is active: a quota charged and a ledger count made
    /// (its meter allocated: `crates/core/src/metering.rs`).
    meter_b: f64,
}

impl Sample {
    fn total(&self) -> f64 {
        self.load + self.build
    }

    fn encode(&self) -> String {
        format!(
            "rss_before={} load={} build={} rss_after={} hwm={} heap={} heap_peak={} allocs={} reload={} hwm_reload={} hit_ns={} miss_ns={} meter_b={}",
            self.rss_before, self.load, self.build, self.rss_after, self.hwm, self.heap,
            self.heap_peak, self.allocs, self.reload, self.hwm_reload, self.hit_ns, self.miss_ns,
            self.meter_b
        )
    }

    fn decode(line: &str) -> Option<Self> {
        let mut s = Sample::default();
        for kv in line.split_whitespace() {
            let (k, v) = kv.split_once('=')?;
            match k {
                "rss_before" => s.rss_before = v.parse().ok()?,
                "load" => s.load = v.parse().ok()?,
                "build" => s.build = v.parse().ok()?,
                "rss_after" => s.rss_after = v.parse().ok()?,
                "hwm" => s.hwm = v.parse().ok()?,
                "heap" => s.heap = v.parse().ok()?,
                "heap_peak" => s.heap_peak = v.parse().ok()?,
                "allocs" => s.allocs = v.parse().ok()?,
                "reload" => s.reload = v.parse().ok()?,
                "hwm_reload" => s.hwm_reload = v.parse().ok()?,
                "hit_ns" => s.hit_ns = v.parse().ok()?,
                "miss_ns" => s.miss_ns = v.parse().ok()?,
                "meter_b" => s.meter_b = v.parse().ok()?,
                _ => {}
            }
        }
        Some(s)
    }
}

/// The child: load `path` (which holds `n` keys), measure, print one line.
fn measure(path: &Path, n: usize) -> Sample {
    let (rss_before, _) = rss();
    let allocs0 = ALLOCS.load(Ordering::Relaxed);
    let t = Instant::now();
    let config = Config::load(path).expect("generated config is valid");
    let load = t.elapsed();
    let t = Instant::now();
    let policy = Policy::new(config, None);
    let build = t.elapsed();
    let allocs = ALLOCS.load(Ordering::Relaxed) - allocs0;
    assert_eq!(policy.keys.len(), n + 2, "every key and both partners");
    let (rss_after, hwm) = rss();
    let heap = LIVE.load(Ordering::Relaxed) as u64;
    let heap_peak = PEAK.load(Ordering::Relaxed) as u64;

    let t = Instant::now();
    let config = Config::load(path).expect("generated config is valid");
    let again = Policy::new(config, Some(&policy));
    let reload = t.elapsed();
    drop(policy);
    let (_, hwm_reload) = rss();
    let (hit_ns, miss_ns) = lookups(&again, n);
    let meter_b = meters(&again, n);

    Sample {
        rss_before,
        load: load.as_secs_f64(),
        build: build.as_secs_f64(),
        rss_after,
        hwm,
        heap,
        heap_peak,
        allocs,
        reload: reload.as_secs_f64(),
        hwm_reload,
        hit_ns,
        miss_ns,
        meter_b,
    }
}

/// Heap bytes per key for the meters of `n` active keys: each key charged to a quota and
/// counted in the ledger once (what the first metered request of a key allocates).
fn meters(policy: &Policy, n: usize) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let before = LIVE.load(Ordering::Relaxed);
    let period = tollgate_core::metering::PeriodAt::of(tollgate_core::config::Period::Month, 0);
    for (_, e) in policy.keys.iter() {
        let m = policy.metering.meter(&e.rate, &e.name);
        let _ = m.charge(1_000, &period);
        m.count(0, tollgate_core::metering::Column::Upstream2xx, 1);
    }
    let grown = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    grown as f64 / n as f64
}

/// ns per lookup of digests of present keys (or partners, for N = 0) and of absent ones, in a
/// scattered order (as requests from many clients come), after hashing (not timed).
fn lookups(policy: &Policy, n: usize) -> (f64, f64) {
    const M: usize = 200_000;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let present: Vec<Digest> = (0..M)
        .map(|_| {
            let key = match n {
                0 => "acme-partner-key".to_string(),
                _ => format!("key-{}", next() as usize % n),
            };
            Digest::of(key.as_bytes())
        })
        .collect();
    let absent: Vec<Digest> = (0..M)
        .map(|i| Digest::of(format!("absent-{i}").as_bytes()))
        .collect();
    let time = |ds: &[Digest], want: bool| {
        let t = Instant::now();
        let mut found = 0usize;
        for d in ds {
            found += usize::from(std::hint::black_box(policy.keys.lookup(d)).is_some());
        }
        let ns = t.elapsed().as_nanos() as f64 / ds.len() as f64;
        assert_eq!(found, if want { ds.len() } else { 0 });
        ns
    };
    (time(&present, true), time(&absent, false))
}

/// The child for `--phases`: time the parts of `Config::load` on their own.
fn phases(path: &Path) {
    let t = Instant::now();
    let text = std::fs::read_to_string(path).unwrap();
    let read = t.elapsed();
    let t = Instant::now();
    let raw: tollgate_core::config::file::FileConfig = serde_yaml::from_str(&text).unwrap();
    let serde = t.elapsed();
    let keys = raw.keys.len();
    drop(raw);
    let t = Instant::now();
    let events = count_events(&text);
    let events_time = t.elapsed();
    let t = Instant::now();
    let config = Config::parse(&text, path, &tollgate_core::config::ProcessEnv).unwrap();
    let parse = t.elapsed();
    drop(config);
    println!("| phase | time |");
    println!("|---|---:|");
    println!(
        "| read the file ({} MB) | {} |",
        text.len() / 1_000_000,
        secs(read)
    );
    println!(
        "| serde_yaml → `FileConfig` ({keys} keys) | {} |",
        secs(serde)
    );
    println!(
        "| yaml_rust2 event walk alone ({events} events) | {} |",
        secs(events_time)
    );
    println!(
        "| `Config::parse` (everything but the read) | {} |",
        secs(parse)
    );
}

/// Parse `text` with yaml_rust2 and only count the events (the floor of any line-index walk).
fn count_events(text: &str) -> usize {
    use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
    use yaml_rust2::scanner::Marker;
    struct Count(usize);
    impl MarkedEventReceiver for Count {
        fn on_event(&mut self, _: Event, _: Marker) {
            self.0 += 1;
        }
    }
    let mut c = Count(0);
    Parser::new_from_str(text).load(&mut c, false).unwrap();
    c.0
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1024.0 * 1024.0))
}

fn per_key(over: u64, base: u64, n: usize) -> String {
    if n == 0 {
        return "—".into();
    }
    format!("{:.0}", (over as f64 - base as f64) / n as f64)
}

fn run_child(exe: &Path, args: &[&str]) -> String {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("re-execute the benchmark");
    assert!(
        out.status.success(),
        "child {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--measure") {
        let path = Path::new(&args[i + 1]);
        let n: usize = args[i + 2].parse().expect("N");
        println!("{}", measure(path, n).encode());
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--generate") {
        let n: usize = args[i + 1].parse().expect("N");
        std::fs::write(&args[i + 2], generate(n, Style::from_env())).expect("write the config");
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--phases-child") {
        phases(Path::new(&args[i + 1]));
        return;
    }
    // `cargo bench` passes `--bench`; a name filter may follow. Without `--bench` this is
    // `cargo test --all-targets` running the bench as a smoke test (debug build): one run of a
    // small config, so that the measuring code is exercised without timing anything.
    let smoke = !args.iter().any(|a| a == "--bench");
    let want_phases = args.iter().any(|a| a == "--phases");

    let sizes: Vec<usize> = match std::env::var("KEYSCALE_SIZES") {
        Ok(v) => v
            .split(',')
            .map(|s| s.trim().parse().expect("KEYSCALE_SIZES"))
            .collect(),
        Err(_) if smoke => vec![0, 1000],
        Err(_) => DEFAULT_SIZES.to_vec(),
    };
    let runs: usize = std::env::var("KEYSCALE_RUNS")
        .ok()
        .map_or(if smoke { 1 } else { 3 }, |v| {
            v.parse().expect("KEYSCALE_RUNS")
        });
    let style = Style::from_env();
    let exe = std::env::current_exe().expect("own path");
    let dir = tempfile::tempdir().expect("temp dir");

    let mut rows = Vec::new();
    for &n in &sizes {
        let path = dir.path().join(format!("keys-{n}.yaml"));
        let text = generate(n, style);
        std::fs::write(&path, &text).expect("write config");
        let mut samples: Vec<Sample> = (0..runs.max(1))
            .map(|_| {
                let out = run_child(&exe, &["--measure", path.to_str().unwrap(), &n.to_string()]);
                Sample::decode(out.trim()).expect("child output")
            })
            .collect();
        samples.sort_by(|a, b| a.total().total_cmp(&b.total()));
        let mid = samples.len() / 2;
        let median = |f: fn(&Sample) -> f64| {
            let mut v: Vec<f64> = samples.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[mid]
        };
        let mut m = samples[mid].clone();
        m.load = median(|s| s.load);
        m.build = median(|s| s.build);
        m.reload = median(|s| s.reload);
        m.hit_ns = median(|s| s.hit_ns);
        m.miss_ns = median(|s| s.miss_ns);
        eprintln!("N = {n}: {:.3} s", m.total());
        rows.push((n, text.len(), m));
        if want_phases && Some(&n) == sizes.iter().max() {
            print!(
                "{}",
                run_child(&exe, &["--phases-child", path.to_str().unwrap()])
            );
            println!();
        }
    }

    let base = rows.iter().find(|r| r.0 == 0).map(|r| r.2.clone());
    println!(
        "| keys | file | load (parse + validate) | build (key table) | total | RSS after | peak RSS | B/key (RSS) | heap B/key | allocs/key | reload (load + carry-over build) | peak RSS in reload | lookup hit / miss | heap B/active key (meter) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (n, size, s) in &rows {
        let (rss_b, heap_b) = base.as_ref().map_or((0, 0), |b| (b.rss_after, b.heap));
        println!(
            "| {n} | {:.1} MB | {:.3} s | {:.3} s | {:.3} s | {} MiB | {} MiB | {} | {} | {} | {:.3} s | {} MiB | {:.0} / {:.0} ns | {:.0} |",
            *size as f64 / 1e6,
            s.load,
            s.build,
            s.total(),
            mib(s.rss_after),
            mib(s.hwm),
            per_key(s.rss_after, rss_b, *n),
            per_key(s.heap, heap_b, *n),
            if *n == 0 { "—".to_string() } else { format!("{:.1}", s.allocs as f64 / *n as f64) },
            s.reload,
            mib(s.hwm_reload),
            s.hit_ns,
            s.miss_ns,
            s.meter_b,
        );
    }
    println!();
    println!(
        "Command: `KEYSCALE_RUNS={runs} KEYSCALE_SIZES={} KEYSCALE_STYLE={} cargo bench -p tollgate-core --bench keys`; {} cores; release profile.",
        sizes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(","),
        format!("{style:?}").to_lowercase(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
}
