//! The command line: `run`, `demo`, `stand-in`, `check`, `hash-key`, `top`, `keys`.
//!
//! Every flag's help says what it does (`tollgate <command> --help`). `run` takes Pingora's own
//! flags too (its `Opt`, flattened: `-u/--upgrade`, `-d/--daemon`, `-t/--test`, `-c/--conf` and
//! the hidden `--nocapture`); Pingora's help for them speaks of "a pingora-based service" or
//! reads like Tollgate's `--config`, so [`Command::Run`] replaces it (`pingora_help`) with
//! text that starts `Pingora:` and says what the flag does in Tollgate. Names, short forms and
//! behaviour are Pingora's, unchanged (a public contract: scripts and the systemd unit use
//! them); the tests below hold every flag to a description and the list of flags to the one
//! here.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Arg, Parser, Subcommand};

use crate::config::Config;
use crate::digest::is_token68;
use crate::digest::Digest;
use crate::runtime::logging::{init_logging, LogWriter};
use crate::server;

mod admin_client;
mod keys;
mod summary;

use summary::overrides_summary;
pub use summary::summary;

#[derive(Parser, Debug)]
#[command(
    name = "tollgate",
    version,
    about = "Edge policy gateway for a messaging API"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Pingora's `--upgrade`, as Tollgate uses it.
const UPGRADE_HELP: &str = "Pingora: take the listening sockets over from the running \
    process, through the upgrade_sock that --conf sets (zero-downtime upgrade: then send the old \
    process SIGQUIT)";
/// Pingora's `--daemon`.
const DAEMON_HELP: &str = "Pingora: fork into the background (pid_file and error_log as \
    --conf sets them); also on when --conf says `daemon: true`";
/// Pingora's `--test`: it acts only in Pingora's bootstrap, which `run` calls for `--upgrade`.
const TEST_HELP: &str = "Pingora: with --upgrade, exit 0 once the config has loaded, before \
    taking the sockets over (a dry run of an upgrade); without --upgrade it changes nothing";
/// Pingora's `--conf`: not Tollgate's config.
const CONF_HELP: &str = "Pingora: a settings file for Pingora itself (YAML: threads, \
    work_stealing, pid_file, upgrade_sock, error_log, daemon, user/group), not Tollgate's \
    --config; it replaces the `runtime` block of --config, and its grace_period_seconds and \
    graceful_shutdown_timeout_seconds give way to the `shutdown` block of --config";
/// Pingora's hidden `--nocapture`.
const NOCAPTURE_HELP: &str =
    "Pingora: ignored (accepted so that a stray `cargo test` flag does not stop the process)";

/// What `run --help` adds after the flags: the admin listener's API, in short.
const RUN_AFTER_HELP: &str = "The admin listener (admin_listen) serves /metrics, /healthz, \
    /readyz, POST /reload, the usage page at /, and changes keys live, on every replica: \
    GET /api/keys/NAME; POST /api/keys/NAME/suspend, /resume, /revoke; POST /api/keys/revoke \
    with {\"key\": \"<the leaked secret>\"}; PUT or DELETE /api/keys/NAME/limit \
    ({\"requests_per_window\": N}) and /quota ({\"requests\": N, \"per\": \"day\"|\"month\"}). \
    See docs/operations.md.";

/// An argument of Pingora's `Opt` with `help` in place of Pingora's text (the short help, and
/// no long help, so `-h` and `--help` say the same).
fn pingora_help(help: &'static str) -> impl FnOnce(Arg) -> Arg {
    move |a| a.help(help).long_help(None::<&str>)
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve with the config in FILE. Pingora's own flags (--upgrade, --daemon, --test, --conf;
    /// their help starts "Pingora:") apply.
    #[command(after_long_help = RUN_AFTER_HELP)]
    #[command(
        mut_arg("upgrade", pingora_help(UPGRADE_HELP)),
        mut_arg("daemon", pingora_help(DAEMON_HELP)),
        mut_arg("test", pingora_help(TEST_HELP)),
        mut_arg("conf", |a| pingora_help(CONF_HELP)(a).value_name("PINGORA_YAML")),
        mut_arg("nocapture", pingora_help(NOCAPTURE_HELP))
    )]
    Run {
        /// Tollgate's config (YAML: listeners, upstream, plans, keys, partners), read again on
        /// SIGHUP and on POST /reload to the admin listener.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Serve a config that holds the demo's published keys (a local trial, never real
        /// traffic): without it, such a config is refused, at start and on reload.
        #[arg(long)]
        allow_demo_keys: bool,
        #[command(flatten)]
        pingora: pingora::prelude::Opt,
    },
    /// Serve policies/demo.yaml in front of an embedded stand-in upstream, and print curl lines.
    Demo {
        /// Gateway port on 127.0.0.1.
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Stand-in upstream port on 127.0.0.1.
        #[arg(long, default_value_t = 8081)]
        upstream_port: u16,
        /// Admin listener port (/metrics, /healthz, /readyz, POST /reload) on 127.0.0.1.
        #[arg(long, default_value_t = 9091)]
        admin_port: u16,
    },
    /// Serve only the demo's stand-in upstream (every request: `200 {}`), for load tests.
    /// SIGTERM or SIGINT stops it at once (no grace period).
    StandIn {
        /// The address to serve on, host:port.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
        listen: String,
    },
    /// Validate a config without serving: print a summary, or the error with file, line, field.
    Check {
        /// Tollgate's config (YAML) to validate, as `run --config` would load it.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Accept the demo's published keys, as `run --allow-demo-keys` does (the banner is
        /// printed all the same).
        #[arg(long)]
        allow_demo_keys: bool,
        /// Do not resolve the upstream's host (checking on a machine other than the one that
        /// serves: `run` resolves it at start, and refuses a host that does not resolve).
        #[arg(long)]
        no_resolve: bool,
    },
    /// Read a key on stdin (one trailing newline stripped), print its hex SHA-256 for the YAML.
    HashKey,
    /// The usage view in the terminal: busiest keys, refusals, config, cluster (live; q quits).
    /// The admin token, if the listener needs one, is read from TOLLGATE_ADMIN_TOKEN.
    Top {
        /// The admin listener, http://host:port.
        #[arg(long, default_value = "http://127.0.0.1:9091")]
        admin: String,
        /// Print one frame as plain text and exit: as wide as the terminal (everything, when
        /// stdout is not a terminal), every row, no escape sequences.
        #[arg(long)]
        once: bool,
    },
    /// Keys through the admin listener's API: list, show, suspend, resume, revoke, limit,
    /// quota, revoke-secret (the token from TOLLGATE_ADMIN_TOKEN; a table, or --json; exit 1
    /// with the problem's detail on stderr).
    Keys(keys::KeysArgs),
}

/// The command line read, or the exit code of a usage error, printed first (help and
/// `--version` are printed and exit 0). A usage error of `keys` exits 1, as every failure of
/// that client does (scripts tell success from failure, 0 or 1); of the other commands, 2,
/// clap's own.
pub fn parse() -> Result<Cli, ExitCode> {
    Cli::try_parse().map_err(|e| {
        let _ = e.print();
        let keys = std::env::args_os().nth(1).is_some_and(|a| a == "keys");
        match e.exit_code() {
            0 => ExitCode::SUCCESS,
            _ if keys => ExitCode::FAILURE,
            code => ExitCode::from(u8::try_from(code).unwrap_or(2)),
        }
    })
}

/// Run a parsed command; the binary's `main` calls this.
pub fn dispatch(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run {
            config,
            allow_demo_keys,
            pingora,
        } => run(&config, allow_demo_keys, pingora),
        Command::Demo {
            port,
            upstream_port,
            admin_port,
        } => match crate::demo::run(port, upstream_port, admin_port) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::StandIn { listen } => {
            let server = crate::demo::stand_in_server(&listen);
            println!("stand-in upstream on http://{listen}");
            server.run_forever()
        }
        Command::Check {
            config,
            allow_demo_keys,
            no_resolve,
        } => check(&config, allow_demo_keys, no_resolve),
        Command::HashKey => hash_key(),
        Command::Top { admin, once } => top(&admin, once),
        Command::Keys(args) => keys::run(args),
    }
}

fn run(path: &std::path::Path, allow_demo_keys: bool, opt: pingora::prelude::Opt) -> ExitCode {
    let cfg = match Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !allow_demo_keys {
        if let Err(e) = crate::runtime::live::refuse_published_keys(&cfg) {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    // `--daemon`, on the command line or in the `--conf` file, forks: no background thread.
    let daemon = opt.daemon
        || (opt.conf.is_some()
            && pingora::server::configuration::ServerConf::load_yaml_with_opt_override(&opt)
                .is_ok_and(|c| c.daemon));
    let writer = if daemon {
        LogWriter::Direct
    } else {
        LogWriter::Background
    };
    let _log = init_logging(cfg.process.log_format, writer);
    for w in &cfg.warnings {
        tracing::warn!(
            file = %cfg.source.display(),
            line = w.line.unwrap_or(0),
            field = %w.field,
            "{}",
            w.message
        );
    }
    let clock = std::sync::Arc::new(crate::clock::MonotonicClock::new());
    match server::build(cfg, clock, Some(opt)) {
        Ok(built) => {
            if !allow_demo_keys {
                built.live.refuse_published_keys();
            }
            built.run();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `tollgate check`: refuses what `run` refuses on this machine (a published demo key without
/// `--allow-demo-keys`, an upstream that does not resolve unless `--no-resolve`), like
/// `nginx -t`, which resolves upstream names too.
fn check(path: &std::path::Path, allow_demo_keys: bool, no_resolve: bool) -> ExitCode {
    let loaded = Config::load(path).and_then(|cfg| {
        if !allow_demo_keys {
            crate::runtime::live::refuse_published_keys(&cfg)?;
        }
        if !no_resolve {
            crate::runtime::live::resolve_upstream(&cfg)?;
        }
        Ok(cfg)
    });
    // The keys issued through the admin API, where they are kept, must fit the file too.
    let loaded = loaded.and_then(|cfg| {
        let kept = overrides_summary(&cfg)?;
        Ok((cfg, kept))
    });
    match loaded {
        Ok((cfg, kept)) => {
            print!("{}", summary(&cfg));
            print!("{kept}");
            if !cfg.published_keys.is_empty() {
                // Loud, on both streams: a config anyone can use must not go unnoticed.
                let banner = format!(
                    "!!! PUBLISHED DEMO KEYS in {}: anyone can use them.\n!!! `tollgate run` refuses this config without --allow-demo-keys; replace them before serving (`tollgate hash-key`).\n",
                    cfg.published_keys.join(", "),
                );
                print!("{banner}");
                eprint!("{banner}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn top(admin: &str, once: bool) -> ExitCode {
    let token = std::env::var("TOLLGATE_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    let admin = match crate::top::Admin::parse(admin, token) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = if once {
        crate::top::once(&admin).map(|frame| print!("{frame}"))
    } else {
        crate::top::run(&admin)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn hash_key() -> ExitCode {
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin()
        .lock()
        .take(64 * 1024)
        .read_to_end(&mut input)
    {
        eprintln!("error: cannot read stdin: {e}");
        return ExitCode::FAILURE;
    }
    let key = input.strip_suffix(b"\n").unwrap_or(&input);
    let key = key.strip_suffix(b"\r").unwrap_or(key);
    if key.is_empty() {
        eprintln!("error: no key on stdin");
        return ExitCode::FAILURE;
    }
    if !is_token68(key) {
        eprintln!(
            "error: that key cannot be sent as a bearer token (allowed: A-Z a-z 0-9 - . _ ~ + / and trailing =)"
        );
        return ExitCode::FAILURE;
    }
    let _ = writeln!(std::io::stdout(), "{}", Digest::of(key).to_hex());
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// The arguments clap adds by itself.
    fn generated(a: &Arg) -> bool {
        matches!(a.get_id().as_str(), "help" | "version")
    }

    /// `(command path, argument)` for every argument of `cmd` and its subcommands, recursively.
    /// Every argument, where it is defined (a global one once, not again in each subcommand
    /// it is propagated to).
    fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, Arg)>, inherited: &[String]) {
        let mut globals = inherited.to_vec();
        for a in cmd.get_arguments().filter(|a| !generated(a)) {
            let id = a.get_id().to_string();
            if a.is_global_set() && inherited.contains(&id) {
                continue;
            }
            if a.is_global_set() {
                globals.push(id);
            }
            out.push((path.to_string(), a.clone()));
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), out, &globals);
        }
    }

    fn all_args() -> Vec<(String, Arg)> {
        let mut cmd = Cli::command();
        cmd.build();
        let mut out = Vec::new();
        walk(&cmd, "tollgate", &mut out, &[]);
        out
    }

    fn text(s: Option<&clap::builder::StyledStr>) -> String {
        s.map(|s| s.to_string()).unwrap_or_default()
    }

    #[test]
    fn the_summary_counts_keys_that_change_with_time_and_shows_partner_effects() {
        use tollgate_core::testing::TestConfig;
        let cfg = TestConfig::new()
            .key_with("basic-1", |k| {
                k.expires_at = Some("2099-01-01T00:00:00Z".into());
                k.requests_per_window = Some(5);
            })
            .parse();
        let s = summary(&cfg);
        assert!(
            s.contains("1 with an expiry, 0 rotating (a previous digest), 1 with a limit of their own, 0 with a quota of their own"),
            "{s}"
        );
        assert!(s.contains("body=service_key effect=suspend"), "{s}");
        assert!(!s.contains("body=service_upgrade effect"), "{s}");
        let plain = summary(&TestConfig::new().parse());
        assert!(!plain.contains("with an expiry"), "{plain}");
    }

    #[test]
    fn the_summary_shows_the_plans_quotas_and_the_ledger() {
        use tollgate_core::testing::TestConfig;
        let cfg = TestConfig::new()
            .plan_quota("basic", 1000, "day")
            .partner_quota(50_000, "month")
            .ledger(30)
            .parse();
        let s = summary(&cfg);
        assert!(s.contains("; quota 1000 / day"), "{s}");
        assert!(
            s.contains("150 requests / 10 s; quota 50000 / month"),
            "{s}"
        );
        assert!(
            s.contains("ledger        every request counted per key and UTC day, 30 days kept"),
            "{s}"
        );
        let plain = summary(&TestConfig::new().parse());
        assert!(!plain.contains("quota"), "{plain}");
        assert!(
            plain.contains("ledger        off (no ledger block)"),
            "{plain}"
        );
    }

    #[test]
    fn the_summary_shows_tracing_when_on() {
        use tollgate_core::testing::TestConfig;
        let plain = summary(&TestConfig::new().parse());
        assert!(
            plain.contains("tracing       off (no tracing block)"),
            "{plain}"
        );
        let cfg = TestConfig::new()
            .tracing("http://otel:4318/", crate::config::OtlpProtocol::Json, 0.1)
            .parse();
        let s = summary(&cfg);
        assert!(
            s.contains(
                "tracing       spans to http://otel:4318/v1/traces (http/json), service `tollgate-test`; new traces recorded at ratio 0.1"
            ),
            "{s}"
        );
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_says_what_it_does() {
        let args = all_args();
        assert!(args.len() >= 14, "{}", args.len());
        for (path, a) in &args {
            let help = text(a.get_help());
            assert!(
                help.trim().len() >= 10,
                "`{path} --{}` has no description: {help:?}",
                a.get_id()
            );
            if let Some(long) = a.get_long_help() {
                assert!(!long.to_string().trim().is_empty(), "{path} {}", a.get_id());
            }
        }
    }

    /// Pingora's flags, taken from Pingora's own `Opt`: each is still there under `run` with
    /// its name, short form and visibility, and its help (short and long) starts `Pingora:`;
    /// no other flag's does.
    #[test]
    fn pingora_flags_are_labelled_as_pingora() {
        let mut opt = pingora::prelude::Opt::command();
        opt.build();
        let theirs: Vec<&Arg> = opt.get_arguments().filter(|a| !generated(a)).collect();
        assert!(theirs.len() >= 4, "{theirs:?}");
        let args = all_args();
        for p in &theirs {
            let id = p.get_id().as_str();
            let (_, a) = args
                .iter()
                .find(|(path, a)| path == "tollgate run" && a.get_id() == id)
                .unwrap_or_else(|| panic!("Pingora's --{id} is not under `run`"));
            assert_eq!(
                (a.get_long(), a.get_short(), a.is_hide_set()),
                (p.get_long(), p.get_short(), p.is_hide_set()),
                "--{id}"
            );
            for help in [text(a.get_help()), text(a.get_long_help())] {
                if !help.is_empty() {
                    assert!(help.starts_with("Pingora: "), "--{id}: {help}");
                }
            }
            assert_ne!(
                text(a.get_help()),
                text(p.get_help()),
                "--{id}: Pingora's text"
            );
        }
        let conf = text(
            args.iter()
                .find(|(path, a)| path == "tollgate run" && a.get_id() == "conf")
                .map(|(_, a)| a)
                .unwrap()
                .get_help(),
        );
        assert!(
            conf.contains("not Tollgate's --config") && conf.contains("threads"),
            "{conf}"
        );
        for (path, a) in &args {
            if !theirs.iter().any(|p| p.get_id() == a.get_id()) {
                assert!(
                    !text(a.get_help()).contains("Pingora:"),
                    "{path} --{}",
                    a.get_id()
                );
            }
        }
    }

    /// Flag names are a public contract (scripts, the systemd unit, the docs): this list
    /// changes only on purpose.
    #[test]
    fn the_flags_are_those_documented() {
        let mut got: Vec<String> = all_args()
            .iter()
            .filter(|(_, a)| a.get_long().is_some())
            .map(|(path, a)| {
                let short = a.get_short().map(|c| format!("-{c}/")).unwrap_or_default();
                let long = a.get_long().unwrap_or("?");
                format!("{path} {short}--{long}")
            })
            .collect();
        got.sort();
        let mut want = vec![
            "tollgate run --config",
            "tollgate run --allow-demo-keys",
            "tollgate run -u/--upgrade",
            "tollgate run -d/--daemon",
            "tollgate run --nocapture",
            "tollgate run -t/--test",
            "tollgate run -c/--conf",
            "tollgate demo --port",
            "tollgate demo --upstream-port",
            "tollgate demo --admin-port",
            "tollgate stand-in --listen",
            "tollgate check --config",
            "tollgate check --allow-demo-keys",
            "tollgate check --no-resolve",
            "tollgate top --admin",
            "tollgate top --once",
            "tollgate keys --admin",
            "tollgate keys --json",
            "tollgate keys list --plan",
            "tollgate keys list --partner",
            "tollgate keys list --state",
            "tollgate keys list --source",
            "tollgate keys suspend --reason",
            "tollgate keys limit --clear",
            "tollgate keys quota --clear",
            "tollgate keys create --plan",
            "tollgate keys create --partner",
            "tollgate keys create --expires-at",
            "tollgate keys create --requests-per-window",
            "tollgate keys create --quota",
            "tollgate keys create --sha256",
            "tollgate keys rotate --overlap",
        ];
        want.sort_unstable();
        assert_eq!(got, want);
    }

    /// `run --help` as an operator reads it: every line of an option has a description.
    #[test]
    fn run_help_describes_every_option() {
        let mut cmd = Cli::command();
        let run = cmd.find_subcommand_mut("run").unwrap();
        let help = run.render_help().to_string();
        assert!(help.contains("--conf <PINGORA_YAML>"), "{help}");
        assert!(!help.contains("pingora-based service"), "{help}");
        for line in help.lines().filter(|l| l.trim_start().starts_with('-')) {
            let words: Vec<&str> = line.split("  ").filter(|w| !w.trim().is_empty()).collect();
            assert!(words.len() >= 2, "no description: {line:?}\n{help}");
        }
    }
}
