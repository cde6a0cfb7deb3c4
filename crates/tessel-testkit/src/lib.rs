//! Backend conformance tests shared by every backend crate (being written).
