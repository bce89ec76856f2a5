//! Logging: `tracing` to stderr, as text or JSON, written by a background thread.
//!
//! Pingora logs through the `log` crate, raw request bytes (bearer keys included) among them;
//! no bridge from `log` is installed, so none of that can reach the output.

use crate::config::LogFormat;

/// How log lines reach stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogWriter {
    /// A background thread takes the lines and writes them in batches (one `write` per batch,
    /// not per line), so a slow log sink never stalls a request. No line is dropped: past
    /// 128,000 queued lines, logging waits. Lines still queued are written at exit (not after
    /// a SIGKILL).
    Background,
    /// Each line written from the thread that logs it. For `--daemon`: the background thread
    /// would not survive Pingora's fork.
    Direct,
}

/// Keeps the background log writer running; drop it last (it writes what is queued).
pub struct LogGuard {
    _worker: Option<tracing_appender::non_blocking::WorkerGuard>,
}

/// Install the log subscriber. Pingora logs through the `log` crate, raw request bytes
/// included; no bridge from `log` is installed, so none of that can reach the output.
pub fn init_logging(format: LogFormat, writer: LogWriter) -> LogGuard {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("TOLLGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a terminal: journald, files and log shippers get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (make_writer, guard) = match writer {
        LogWriter::Background => {
            let (w, g) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                .lossy(false)
                .thread_name("tollgate-log")
                .finish(std::io::BufWriter::with_capacity(
                    64 * 1024,
                    std::io::stderr(),
                ));
            (
                tracing_subscriber::fmt::writer::BoxMakeWriter::new(w),
                Some(g),
            )
        }
        LogWriter::Direct => (
            tracing_subscriber::fmt::writer::BoxMakeWriter::new(std::io::stderr),
            None,
        ),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(make_writer);
    let _ = match format {
        LogFormat::Text => tracing::subscriber::set_global_default(builder.finish()),
        LogFormat::Json => tracing::subscriber::set_global_default(builder.json().finish()),
    };
    LogGuard { _worker: guard }
}
