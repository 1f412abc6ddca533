//! The library's integration tests, one module a file, in one test binary: each binary links
//! the library with wgpu and naga, so twelve files make one link instead of twelve. Run one
//! file's tests with a filter: `cargo test --release --test suite diloco::`.
//!
//! Kept apart, each its own binary: `golden.rs`, `mpi.rs` and `nats.rs` (harness-less
//! runners that print a line per kind), `budget.rs` (it sets the process's memory budget, which
//! the tests here would see) and `large_arena.rs` (arenas of gigabytes, run one at a time),
//! and `layers.rs` (it reads the sources, not the library).

#[path = "../common/mod.rs"]
mod common;

mod arenas;
mod diloco;
mod elastic;
mod fuzz;
mod join;
mod misuse;
mod optim_kernels;
mod optim_state;
mod properties;
mod replicas;
mod rpc;
mod step_api;
mod train;
