use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc malloc: fewer cycles per request on the proxy path
/// (docs/benchmarks.md, tuning step 1). Its v2 line (the crate's `v2` feature): the crate hands
/// every allocation to `mi_malloc_aligned`, which v2 serves from the plain small-object path for
/// Rust's alignments, where v3 sends most sizes to an over-allocating fallback (step 12).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tollgate::cli::dispatch(tollgate::cli::Cli::parse())
}
