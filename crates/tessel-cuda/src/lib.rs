//! Tessel's CUDA backend (being written).
