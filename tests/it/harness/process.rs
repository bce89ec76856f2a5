//! The `tollgate` binary as its own process, and the panic hook that shows a failing test's
//! message before the process's log tail.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The `tollgate` binary running as its own process, killed when dropped. Its stdout and
/// stderr go to files, so a test can read everything it printed.
pub(crate) struct Process {
    pub(crate) child: std::process::Child,
    pub(crate) stdout: std::path::PathBuf,
    pub(crate) stderr: std::path::PathBuf,
}

impl Process {
    /// `tollgate <args>` with `env`, output captured under `dir` with `tag` in the file names.
    pub(crate) fn spawn(dir: &Path, tag: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn_limited(dir, tag, args, env, None)
    }

    /// [`Process::spawn`], with `RLIMIT_NOFILE` (soft and hard) set to `nofile` when given.
    fn spawn_limited(
        dir: &Path,
        tag: &str,
        args: &[&str],
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> Self {
        let stdout = dir.join(format!("{tag}.stdout"));
        let stderr = dir.join(format!("{tag}.stderr"));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit is async-signal-safe and reads only `lim`.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let child = cmd.spawn().expect("the tollgate binary starts");
        remember_failures();
        Self {
            child,
            stdout,
            stderr,
        }
    }

    /// `tollgate run` on `config`, written to `dir/<tag>.yaml`, logging at `info`, once its
    /// `/readyz` answers 200; with its listener and admin addresses.
    pub(crate) fn run(
        dir: &Path,
        tag: &str,
        config: &tollgate_core::testing::TestConfig,
    ) -> (Self, std::net::SocketAddr, std::net::SocketAddr) {
        Self::run_limited(dir, tag, config, None)
    }

    /// [`Process::run`] under a descriptor limit (`RLIMIT_NOFILE`, soft and hard) when given.
    pub(crate) fn run_limited(
        dir: &Path,
        tag: &str,
        config: &tollgate_core::testing::TestConfig,
        nofile: Option<u64>,
    ) -> (Self, std::net::SocketAddr, std::net::SocketAddr) {
        let path = dir.join(format!("{tag}.yaml"));
        config.write(&path);
        let p = Self::spawn_limited(
            dir,
            tag,
            &["run", "--config", path.to_str().unwrap()],
            &[("TOLLGATE_LOG", "info")],
            nofile,
        );
        let listen = config.file.listen.parse().unwrap();
        let admin_addr = config.file.admin_listen.parse().unwrap();
        super::wait_ready(admin_addr, 200);
        (p, listen, admin_addr)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal by name (`HUP`, `TERM`, `QUIT`, `INT`).
    pub(crate) fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .args(["-s", name, &self.pid().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -s {name} failed");
    }

    /// Wait (bounded by `limit`) for the process to exit.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop it as an operator would (SIGINT), so every queued log line is written; wait
    /// (bounded) for the exit.
    pub(crate) fn stop(&mut self) -> std::process::ExitStatus {
        self.signal("INT");
        self.wait_exit(Duration::from_secs(15))
            .expect("exits on SIGINT")
    }

    /// Everything it printed so far, stdout then stderr.
    pub(crate) fn output(&self) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        format!("{}{}", read(&self.stdout), read(&self.stderr))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let out = self.output();
            // A panic of the process itself, whose backtrace would push its message out of the
            // tail below.
            let lines: Vec<&str> = out.lines().collect();
            for (i, l) in lines.iter().enumerate() {
                if l.contains("panicked at") {
                    eprintln!("--- {} panicked:", self.stdout.display());
                    for l in &lines[i..(i + 3).min(lines.len())] {
                        eprintln!("{l}");
                    }
                }
            }
            let tail: Vec<&str> = lines.iter().rev().take(40).copied().collect();
            eprintln!("--- {} output (last lines) ---", self.stdout.display());
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
            // The failure itself came before every process's lines: say it again after them, so
            // that the end of a long log (all a CI summary may show) names what failed.
            if let Some(why) = failure_of_this_thread() {
                eprintln!("--- the failure above, again: {why}");
            }
        }
    }
}

/// Each test thread's panic message, kept by the hook [`remember_failures`] installs.
static FAILURES: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Install (once) a panic hook that keeps each thread's panic message for [`Process`]'s drop,
/// then prints it as the default hook does.
fn remember_failures() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("?").to_string();
            let at = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let what = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if let Ok(mut f) = FAILURES.lock() {
                f.push((thread, format!("{what}{at}")));
            }
            default(info);
        }));
    });
}

fn failure_of_this_thread() -> Option<String> {
    let thread = std::thread::current().name().unwrap_or("?").to_string();
    let f = FAILURES.lock().ok()?;
    f.iter()
        .rev()
        .find(|(t, _)| *t == thread)
        .map(|(_, m)| m.clone())
}
