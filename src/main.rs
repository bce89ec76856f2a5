use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    tollgate::cli::dispatch(tollgate::cli::Cli::parse())
}
