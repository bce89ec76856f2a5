use std::process::ExitCode;

/// mimalloc instead of glibc malloc ([`tollgate::runtime::alloc::MiMalloc`]).
#[global_allocator]
static GLOBAL: tollgate::runtime::alloc::MiMalloc = tollgate::runtime::alloc::MiMalloc;

fn main() -> ExitCode {
    match tollgate::cli::parse() {
        Ok(cli) => tollgate::cli::dispatch(cli),
        Err(code) => code,
    }
}
