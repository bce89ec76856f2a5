use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc malloc: fewer cycles per request on the proxy path
/// (docs/benchmarks.md, tuning step 1).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tollgate::cli::dispatch(tollgate::cli::Cli::parse())
}
