//! The Tensor conformance suite: every op against plain-Rust `f64` references on seeded
//! random data, on the device `TESSEL_DEVICE` names (the CPU by default).
//!
//! One test binary rather than one per file: each links every compiled-in backend, so one
//! link is much faster to build and much smaller to ship to a GPU host
//! (`cargo xtask test-gpu --bundle`). Tests that read process-wide counters live in their
//! own binaries (`tests/memory.rs`).
//!
//! A dtype the device cannot compute (`f64` or 64-bit integers on some GPUs) is skipped,
//! with a `tessel-skip:` line on stderr that `cargo xtask test-gpu` counts.

mod autograd;
mod common;
mod compiled;
mod conv;
mod creation;
mod custom;
mod devices;
mod dynamic;
mod einsum;
mod elementwise;
mod float8;
mod fusion;
mod fusion_elementwise;
mod indexing;
mod math;
mod matmul;
mod movement;
mod padding;
mod pool;
mod reduce;
mod rewrites;
mod scan;
mod sort;
