use std::process::ExitCode;

use clap::Parser;

/// mimalloc instead of glibc malloc ([`tollgate::runtime::alloc::MiMalloc`]).
#[global_allocator]
static GLOBAL: tollgate::runtime::alloc::MiMalloc = tollgate::runtime::alloc::MiMalloc;

fn main() -> ExitCode {
    tollgate::cli::dispatch(tollgate::cli::Cli::parse())
}
