//! P0m — P0 (`p0.rs`, the bare Pingora pass-through) with Tollgate's own allocator, mimalloc
//! through the same [`GlobalAlloc`](std::alloc::GlobalAlloc) as the gateway's binary: the
//! baseline that differs from the gateway only by the gateway's work.
//!
//!   cargo build --release --locked --example p0m
//!   target/release/examples/p0m 127.0.0.1:41082 127.0.0.1:41081 1

#[global_allocator]
static GLOBAL: tollgate::runtime::alloc::MiMalloc = tollgate::runtime::alloc::MiMalloc;

#[path = "p0.rs"]
mod p0;

fn main() {
    p0::main()
}
