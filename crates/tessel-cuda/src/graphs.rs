//! CUDA graphs: a launch sequence the runtime repeats (a cached plan) is recorded from its
//! device's stream once and replayed with one `cuGraphLaunch`, instead of one driver call
//! per kernel, cuBLAS call and fill.
//!
//! A call whose buffers and dims match no recording kept launches plainly, unless one of the
//! sequence's last [`PER_SEQUENCE`] calls had the same ones: then it records. So a plan run
//! once costs nothing, nor does one whose buffers or dims change every call (a decoding
//! step, whose cache grows); one run again on the same buffers records on its second call.
//! Recording queues the launches while the stream captures (holding
//! the device's submission gate exclusively, so no other thread's work joins the graph),
//! the graph is instantiated, then launched. A recording replays only for the very buffers
//! (device pointers and sizes) and dim values it was recorded with, so a replay runs
//! exactly what plain launches would queue; scratch memory its launches used (padded
//! half-precision GEMM rows) stays with it. [`PER_SEQUENCE`] recordings are kept per
//! sequence, least recently used evicted; a sequence whose recordings keep being evicted
//! unreplayed (its buffers differ every call) goes back to plain launches, as does one
//! whose capture fails (a call the driver does not allow while capturing).

use std::sync::Arc;

use rustc_hash::FxHashMap;
use tessel_ir::handles::lock;
use tessel_ir::{BackendError, SequenceId, SequenceLaunch};
use tessel_shape::Bindings;

use crate::device::CudaDevice;
use crate::ffi::{self, GraphExec};
use crate::{CudaBackend, Program};

/// Recordings kept per sequence: a training loop alternates between a few sets of buffers.
pub(crate) const PER_SEQUENCE: usize = 4;
/// Sequences tracked; the least recently used is forgotten past this.
const SEQUENCES: usize = 256;
/// Recordings evicted without one replay before a sequence stays on plain launches.
const WASTED: u32 = 2 * PER_SEQUENCE as u32;

/// The launch sequences seen and their recordings.
#[derive(Default)]
pub(crate) struct Graphs {
    state: std::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Advanced by every call; orders sequences by last use.
    clock: u64,
    /// By the runtime's sequence id.
    sequences: FxHashMap<SequenceId, Sequence>,
}

#[derive(Default)]
struct Sequence {
    last_used: u64,
    /// Never record again: a capture failed, or recordings go unused.
    plain: bool,
    /// Recordings evicted without a replay.
    wasted: u32,
    /// Fingerprints of the buffers and dims of the last calls that matched no recording,
    /// newest last.
    recent: std::collections::VecDeque<u64>,
    /// Most recently used first, each with its replay count.
    recordings: Vec<(Arc<Recording>, u64)>,
}

/// A recorded sequence and what its replays need alive.
pub(crate) struct Recording {
    exec: GraphExec,
    /// Per launch: the program id, its buffer count, then each buffer's pointer and size.
    key: Vec<u64>,
    dims: Bindings,
    /// Blocks the launches used as scratch, returned to the pool with the recording.
    scratch: Vec<(u64, usize)>,
    /// Keeps the recorded functions' modules loaded.
    _programs: Vec<Arc<Program>>,
    /// Last: the executable graph and the scratch go before the device.
    device: Arc<CudaDevice>,
}

impl Drop for Recording {
    fn drop(&mut self) {
        // Stream-ordered like every pool block: whoever gets these next queues after the
        // last replay.
        let mut pool = lock(&self.device.pool);
        for &(ptr, class) in &self.scratch {
            pool.release(ptr, class);
        }
    }
}

/// What one call of a sequence does.
enum Decision {
    Replay(Arc<Recording>),
    Plain,
    Record,
}

impl Graphs {
    fn decide(&self, sequence: SequenceId, key: &[u64], dims: &Bindings) -> Decision {
        let mut st = lock(&self.state);
        st.clock += 1;
        let now = st.clock;
        if !st.sequences.contains_key(&sequence) && st.sequences.len() >= SEQUENCES {
            let oldest = st.sequences.iter().min_by_key(|(_, s)| s.last_used);
            if let Some((&id, _)) = oldest {
                st.sequences.remove(&id);
            }
        }
        let seq = st.sequences.entry(sequence).or_default();
        seq.last_used = now;
        if seq.plain {
            return Decision::Plain;
        }
        let hit = seq
            .recordings
            .iter()
            .position(|(r, _)| r.key == key && r.dims == *dims);
        if let Some(i) = hit {
            let (recording, replays) = seq.recordings.remove(i);
            seq.recordings
                .insert(0, (Arc::clone(&recording), replays + 1));
            return Decision::Replay(recording);
        }
        let seen = fingerprint(key, dims);
        if seq.recent.contains(&seen) {
            seq.recent.retain(|&f| f != seen);
            return Decision::Record;
        }
        if seq.recent.len() == PER_SEQUENCE {
            seq.recent.pop_front();
        }
        seq.recent.push_back(seen);
        Decision::Plain
    }

    fn keep(&self, sequence: SequenceId, recording: Arc<Recording>) {
        let mut st = lock(&self.state);
        let seq = st.sequences.entry(sequence).or_default();
        if seq.recordings.len() >= PER_SEQUENCE
            && let Some((_, replays)) = seq.recordings.pop()
            && replays == 0
        {
            seq.wasted += 1;
        }
        if seq.wasted >= WASTED {
            tracing::debug!(
                "tessel-cuda: sequence {}: its buffers change every call; launching plainly",
                sequence.0
            );
            seq.plain = true;
            seq.recordings.clear();
        } else {
            seq.recordings.insert(0, (recording, 0));
        }
    }

    fn give_up(&self, sequence: SequenceId) {
        let mut st = lock(&self.state);
        let seq = st.sequences.entry(sequence).or_default();
        seq.plain = true;
        seq.recordings.clear();
    }
}

/// A hash of a call's buffers and dims (the dims in any order).
fn fingerprint(key: &[u64], dims: &Bindings) -> u64 {
    use std::hash::BuildHasher;
    let build = rustc_hash::FxBuildHasher;
    dims.iter().fold(build.hash_one(key), |total, binding| {
        total.wrapping_add(build.hash_one(binding))
    })
}

impl CudaBackend {
    /// [`tessel_ir::Backend::launch_sequence`]: see the module docs.
    pub(crate) fn run_sequence(
        &self,
        sequence: SequenceId,
        launches: &[SequenceLaunch<'_>],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        if self.config.graphs == CudaGraphs::Off || launches.len() < 2 {
            return self.launch_each(launches, dims);
        }
        let programs = launches
            .iter()
            .map(|&(id, _)| self.programs.get(id))
            .collect::<Result<Vec<_>, _>>()?;
        let device = programs[0].device();
        if programs.iter().any(|p| p.device().index != device.index) {
            return self.launch_each(launches, dims);
        }
        let device = Arc::clone(device);
        let mut key = Vec::with_capacity(launches.len() * 8);
        for &(id, buffers) in launches {
            key.extend([id.0, buffers.len() as u64]);
            for b in self.buffers.get_all(buffers)? {
                key.extend([b.ptr, b.bytes as u64]);
            }
        }
        let recording = match self.graphs.decide(sequence, &key, dims) {
            Decision::Replay(recording) => recording,
            Decision::Plain => return self.launch_each(launches, dims),
            Decision::Record => match self.record(&device, &programs, launches, dims) {
                Ok((exec, scratch)) => {
                    let recording = Arc::new(Recording {
                        exec,
                        key,
                        dims: dims.clone(),
                        scratch,
                        _programs: programs,
                        device: Arc::clone(&device),
                    });
                    self.graphs.keep(sequence, Arc::clone(&recording));
                    self.counters
                        .graph_recordings
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    recording
                }
                Err(why) => {
                    tracing::debug!(
                        "tessel-cuda: sequence {} of {} launches runs without a graph: {why}",
                        sequence.0,
                        launches.len()
                    );
                    self.graphs.give_up(sequence);
                    return self.launch_each(launches, dims);
                }
            },
        };
        let _gate = device.submit();
        recording
            .exec
            .launch(&device.ctx, &device.stream)
            .map_err(|e| device.lost("cuGraphLaunch", e))?;
        self.counters
            .graph_launches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn launch_each(
        &self,
        launches: &[SequenceLaunch<'_>],
        dims: &Bindings,
    ) -> Result<(), BackendError> {
        launches.iter().try_for_each(|&(program, buffers)| {
            tessel_ir::Backend::launch(self, program, buffers, dims)
        })
    }

    /// Records `launches` from `dev`'s stream and instantiates the graph: the executable
    /// and the scratch blocks the launches used, or why not (nothing ran either way).
    fn record(
        &self,
        dev: &CudaDevice,
        programs: &[Arc<Program>],
        launches: &[SequenceLaunch<'_>],
        dims: &Bindings,
    ) -> Result<(GraphExec, Vec<(u64, usize)>), String> {
        let started = std::time::Instant::now();
        let gate = dev
            .gate
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *lock(&dev.captured_scratch) = Some(Vec::new());
        let graph = ffi::begin_capture(&dev.ctx, &dev.stream)
            .map_err(|e| format!("cuStreamBeginCapture failed: {e}"))
            .and_then(|()| {
                let queued = programs
                    .iter()
                    .zip(launches)
                    .try_for_each(|(p, &(_, buffers))| {
                        self.enqueue_unguarded(p, buffers, dims, false).map(drop)
                    });
                // Ended whatever happened, so the stream runs work again.
                let graph = ffi::end_capture(&dev.ctx, &dev.stream)
                    .map_err(|e| format!("cuStreamEndCapture failed: {e}"));
                queued.map_err(|e| e.to_string()).and(graph)
            });
        let scratch = lock(&dev.captured_scratch).take().unwrap_or_default();
        drop(gate);
        let exec = graph.and_then(|graph| {
            GraphExec::new(&dev.ctx, &graph).map_err(|e| format!("cuGraphInstantiate failed: {e}"))
        });
        match exec {
            Ok(exec) => {
                tracing::debug!(
                    "tessel-cuda: {} launches recorded as a graph in {:.0} µs",
                    launches.len(),
                    started.elapsed().as_secs_f64() * 1e6
                );
                Ok((exec, scratch))
            }
            Err(why) => {
                // Nothing recorded ran, so the blocks are free now.
                let mut pool = lock(&dev.pool);
                for (ptr, class) in scratch {
                    pool.release(ptr, class);
                }
                Err(why)
            }
        }
    }
}

/// Whether launch sequences the runtime repeats run as CUDA graphs (`$TESSEL_CUDA_GRAPHS`:
/// `on`, `off`). On by default: on an H100 they made the GPT-2 block, GPT-2's bf16 forward
/// and an MLP's `AdamW` step faster (benches/README.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CudaGraphs {
    /// Recorded once their buffers and dims repeat, then replayed (see the crate docs).
    #[default]
    On,
    /// Every launch queued on its own.
    Off,
}

#[cfg(test)]
mod tests {
    use super::{Decision, Graphs, PER_SEQUENCE};
    use tessel_ir::SequenceId;
    use tessel_shape::{Bindings, Var};

    fn decisions(graphs: &Graphs, sequence: SequenceId, calls: &[(&[u64], &Bindings)]) -> String {
        calls
            .iter()
            .map(|(key, dims)| match graphs.decide(sequence, key, dims) {
                Decision::Replay(_) => 'R',
                Decision::Plain => 'p',
                Decision::Record => 'r',
            })
            .collect()
    }

    /// Without a recording kept (none can be made without a GPU), a call records exactly
    /// when its buffers and dims repeat one of the sequence's last four unmatched calls.
    #[test]
    fn a_sequence_records_only_what_repeats() {
        let graphs = Graphs::default();
        let n = Var::new("graphs_n", 1, 1 << 20).unwrap();
        let none = Bindings::new();
        let (one, two) = (Bindings::new().with(n, 1), Bindings::new().with(n, 2));
        let (a, b): (&[u64], &[u64]) = (&[7, 1, 0x1000, 64], &[7, 1, 0x2000, 64]);
        // The same buffers twice: plain, then record.
        assert_eq!(
            decisions(&graphs, SequenceId::new(), &[(a, &none), (a, &none)]),
            "pr"
        );
        // Alternating buffers: each records on its second sighting.
        assert_eq!(
            decisions(
                &graphs,
                SequenceId::new(),
                &[(a, &none), (b, &none), (a, &none), (b, &none)]
            ),
            "pprr"
        );
        // A dim that changes every call (a decoding step) never records.
        let growing: Vec<Bindings> = (1..=12).map(|v| Bindings::new().with(n, v)).collect();
        let calls: Vec<(&[u64], &Bindings)> = growing.iter().map(|d| (a, d)).collect();
        assert_eq!(
            decisions(&graphs, SequenceId::new(), &calls),
            "p".repeat(12)
        );
        // Dims count as much as buffers; sequences are separate.
        let s = SequenceId::new();
        assert_eq!(
            decisions(&graphs, s, &[(a, &one), (a, &two), (a, &one)]),
            "ppr"
        );
        assert_eq!(decisions(&graphs, SequenceId::new(), &[(a, &one)]), "p");
        // Only the last PER_SEQUENCE calls are remembered.
        let keys: Vec<[u64; 1]> = (0..=PER_SEQUENCE as u64).map(|k| [k]).collect();
        let mut calls: Vec<(&[u64], &Bindings)> = keys.iter().map(|k| (&k[..], &none)).collect();
        calls.push((&keys[0][..], &none));
        assert_eq!(
            decisions(&graphs, SequenceId::new(), &calls),
            "p".repeat(PER_SEQUENCE + 2)
        );
    }
}
