//! Tessel's wgpu backend (being written).
