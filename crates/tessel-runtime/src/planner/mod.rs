//! Planning a realize: candidate programs for each value, measured, and the cheapest
//! closed set of them chosen.
//!
//! 1. [`partition`] (under the runtime lock, pure CPU work): the e-graph's forms of the
//!    subgraph ([`egraph::forms`]: the simplified one, and where a product reads an operand
//!    through a permute, one reading it transposed), each partitioned below. Every value
//!    is named by its e-class, so programs of different forms are alternatives for the
//!    same values, and the chosen plan may combine them.
//!    In the simplified form: the default partition from
//!    the kernelizer, and where the graph holds matrix products ([`find_matmuls`]), a
//!    second partition with each product materialized on its own plus a library routine
//!    ([`VendorOp`]) that can write it, and where the default partition materializes
//!    values that one fuses away, a partition materializing both; where two products make an attention
//!    ([`find_attention`]), a routine that writes the second from the operands of the
//!    first. Every kernel and routine is a [`Candidate`] that
//!    writes some values (graph positions) and reads others.
//!    On a GPU, where the graph has long reductions, a third partition lowers them
//!    cooperatively (a workgroup per output element, partial results combined in local
//!    memory; [`kernelize_cooperative`]).
//!    Where a value shared by several consumers is inlined into each, the shared
//!    partition computes it once instead ([`kernelize_shared`]); where pads or reshapes
//!    of computed views fuse into their readers, the split partition copies them out
//!    once ([`views_to_split`]).
//!    On a GPU the rows partition also fuses row statistics into their readers
//!    ([`kernelize_rows`]: softmax in one kernel). The other forms add their products'
//!    partitions (the routine one, and on a GPU the rows one) and routines.
//! 2. [`compile`] (no lock): each candidate compiled for every device the realize may use:
//!    its own (the *home* device) and those [`set_placement`] adds. A backend without the
//!    routine offers none; a candidate that fails to compile is dropped with a warning
//!    (unless it is the default partition's, on the home device), never failing the
//!    realize.
//! 3. [`choose`](crate::measure::choose): where some value has more than one producer,
//!    every program is measured (see `measure/`) and
//!    [`tessel_graph::placement::place`] picks the cheapest closed set of programs and
//!    copies between devices.
//!
//! Without alternatives (no product, no routine on this backend, one device) the default
//! partition is the plan, and nothing is measured.

mod compile;
mod partition;

use std::sync::{Arc, LazyLock, RwLock};

use tessel_ir::Backend;
use tessel_shape::{DType, Dim};

use crate::device::Device;
use crate::error::Result;
use crate::program::Program;

pub(crate) use compile::{Compiled, Origins, compile, compile_all};
pub(crate) use partition::{Partitions, Work, partition};
/// A device a plan uses, with its backend. Index 0 of a plan's devices is its home.
pub(crate) type PlanDevice = (Device, Arc<dyn Backend>);

/// A compiled schedule, replayable on any leaves with the same signature.
pub(crate) struct Plan {
    /// The devices the plan uses; the first is home (inputs and outputs live there).
    pub(crate) devices: Vec<PlanDevice>,
    /// Launches and copies, in order.
    pub(crate) steps: Vec<PlanStep>,
    /// The buffers the plan allocates: a value on a device, with dtype and element count.
    pub(crate) buffers: Vec<(Place, DType, Dim)>,
    /// Plan input `k` is the realize's leaf `inputs[k]` (in its signature order): rewrites
    /// may drop or reorder leaves.
    pub(crate) inputs: Vec<usize>,
    /// `(position, k)`: the buffer at `position` holds the realize's target `k`.
    pub(crate) outputs: Vec<(usize, usize)>,
    /// The runner-up of the measured choice, run if this plan fails at execution.
    pub(crate) fallback: Option<Arc<Plan>>,
    /// What the plan was chosen from, for `tessel_tensor::inspect::plan_to_dot`.
    pub(crate) view: Option<Arc<PlanView>>,
    /// Names the plan's launches for [`tessel_ir::Backend::launch_sequence`].
    pub(crate) sequence: tessel_ir::SequenceId,
}

/// What a plan was chosen from: every program that was compiled, with its measured time
/// where it was measured, the chosen ones marked, and the chosen copies.
pub(crate) struct PlanView {
    pub(crate) devices: Vec<Device>,
    pub(crate) programs: Vec<ProgramView>,
    /// `(value, from device, to device)`.
    pub(crate) copies: Vec<(PlanSlot, usize, usize)>,
    /// The realize's targets, in order.
    pub(crate) targets: Vec<usize>,
    /// Dtype and element count of every value.
    pub(crate) sizes: Vec<(PlanSlot, DType, Dim)>,
}

/// One program of a [`PlanView`].
pub(crate) struct ProgramView {
    pub(crate) name: String,
    /// A library routine (else a generated kernel).
    pub(crate) routine: bool,
    pub(crate) device: usize,
    pub(crate) reads: Vec<PlanSlot>,
    pub(crate) writes: Vec<usize>,
    /// Median seconds; `None` where it was not measured (a plan without alternatives) or
    /// its output disagreed with the reference.
    pub(crate) time: Option<f64>,
    pub(crate) chosen: bool,
}

impl Plan {
    /// Kernel launches (not copies).
    pub(crate) fn launches(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, PlanStep::Launch { .. }))
            .count()
    }
}

/// One step of a plan.
pub(crate) enum PlanStep {
    /// A program on its device; one buffer per parameter, all on that device.
    Launch {
        program: Arc<Program>,
        device: usize,
        args: Vec<Place>,
    },
    /// A value copied between devices (through the host).
    Copy { from: Place, to: Place },
}

/// A leaf (by signature order) or a buffer (by topological position).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum PlanSlot {
    Input(usize),
    Node(usize),
}

/// A value on one of a plan's devices (an index into [`Plan::devices`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Place {
    pub(crate) slot: PlanSlot,
    pub(crate) device: usize,
}

/// Devices a realize may also run kernels on, besides its own: see [`set_placement`].
static PLACEMENT: RwLock<Vec<Device>> = RwLock::new(Vec::new());

/// Lets realizes also place kernels on `devices`: every kernel is then compiled and
/// measured there too, and a plan may run parts of the work on them, copying values
/// between devices (each copy measured like a kernel) only where a producer and its
/// consumer end up apart. Inputs and outputs stay on the tensors' own device. Off (empty)
/// by default, because compiling and measuring every kernel on every device makes each new
/// plan slower to build; `TESSEL_PLACEMENT=cpu,wgpu:0` sets it at startup.
///
/// ```
/// # fn main() -> tessel_runtime::Result<()> {
/// use tessel_runtime::{Device, set_placement};
/// set_placement(&[Device::cpu()])?;
/// set_placement(&[])?; // off again
/// # Ok(())
/// # }
/// ```
pub fn set_placement(devices: &[Device]) -> Result<()> {
    for d in devices {
        crate::runtime::runtime().backend(*d)?;
    }
    *PLACEMENT
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = devices.to_vec();
    // Plans made for other devices would keep running as they were chosen.
    crate::runtime::runtime().clear_plans();
    Ok(())
}

/// The devices a realize on `home` may use: `home` first, then the placement devices.
pub(crate) fn placement_devices(home: Device) -> Vec<Device> {
    static FROM_ENV: LazyLock<()> = LazyLock::new(|| {
        let Ok(text) = std::env::var("TESSEL_PLACEMENT") else {
            return;
        };
        let parsed: Result<Vec<Device>> = text
            .split(',')
            .filter(|t| !t.trim().is_empty())
            .map(Device::parse)
            .collect();
        match parsed.and_then(|d| set_placement(&d)) {
            Ok(()) => {}
            Err(e) => tracing::warn!("ignoring TESSEL_PLACEMENT: {e}"),
        }
    });
    LazyLock::force(&FROM_ENV);
    let extra = PLACEMENT
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    std::iter::once(home)
        .chain(extra.into_iter().filter(|d| *d != home))
        .collect()
}

/// Whether `device` runs a workgroup's invocations concurrently
/// ([`Features::cooperative_workgroups`](tessel_ir::Features::cooperative_workgroups)).
pub(super) fn cooperative_workgroups(device: Device) -> bool {
    device
        .info()
        .is_ok_and(|info| info.features.cooperative_workgroups)
}
