//! Buffers a forward pass updated lazily (`BatchNorm`'s running statistics in training
//! mode), which the next optimizer step realizes in its own plan: they stay buffers instead
//! of growing into a chain of updates, without the caller listing them.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tessel_tensor::Tensor;

/// Each entry: a layer's updated buffers and the layer's flag saying it is listed, so a
/// layer is listed once however many forward passes run before the step.
type Entry = (Vec<Tensor>, Arc<AtomicBool>);

static PENDING: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

thread_local! {
    /// Registrations made on this thread, listed or not: what a compiled step checks its
    /// loss did not make (the list itself is shared by every thread).
    static REGISTERED: Cell<u64> = const { Cell::new(0) };
}

/// How many times this thread has registered buffers.
pub(crate) fn registered_here() -> u64 {
    REGISTERED.with(Cell::get)
}

/// Lists `buffers` for the next optimizer step, unless `listed` says they already are.
pub(crate) fn register(buffers: &[&Tensor], listed: &Arc<AtomicBool>) {
    REGISTERED.with(|n| n.set(n.get() + 1));
    if listed.swap(true, Ordering::AcqRel) {
        return;
    }
    let buffers = buffers.iter().map(|&t| t.clone()).collect();
    PENDING
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push((buffers, listed.clone()));
}

/// Every listed buffer, emptying the list.
pub(crate) fn take() -> Vec<Tensor> {
    let entries = std::mem::take(&mut *PENDING.lock().unwrap_or_else(PoisonError::into_inner));
    let mut out = Vec::new();
    for (buffers, listed) in entries {
        listed.store(false, Ordering::Release);
        out.extend(buffers);
    }
    out
}
