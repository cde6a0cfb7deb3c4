//! Tessel's benchmarks live in `benches/`; run them with `cargo bench -p tessel-benches`.
