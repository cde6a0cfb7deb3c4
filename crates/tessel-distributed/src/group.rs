//! Process groups: who the ranks are, how they meet, and the collectives on tensors.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use half::{bf16, f16};
use tessel_tensor::{DType, Device, Element, Error, HostBytes, Result, Tensor};

use crate::reduce::{ReduceOp, check_dtype};
use crate::tcp::TcpCollective;

/// Moves host bytes between the ranks of a group: the transport under a [`ProcessGroup`].
/// Every rank must call the same collectives in the same order with the same sizes; an
/// implementation reports a rank that disagrees, exits or stops answering as
/// [`Error::Collective`] rather than waiting forever. Implement it to bring another
/// transport (or a fake one in tests).
pub trait Collective: Send + Sync {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// Replaces `data` (little-endian `dtype` elements) on every rank by their combination
    /// under `op` over all ranks.
    fn all_reduce(&self, dtype: DType, data: &mut Vec<u8>, op: ReduceOp) -> Result<()>;

    /// Replaces `data` on every rank by rank `root`'s.
    fn broadcast(&self, dtype: DType, data: &mut Vec<u8>, root: usize) -> Result<()>;

    /// Every rank's `data`, in rank order.
    fn all_gather(&self, dtype: DType, data: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
}

/// A group of one: every collective returns its input.
struct Alone;

impl Collective for Alone {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce(&self, _: DType, _: &mut Vec<u8>, _: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _: DType, _: &mut Vec<u8>, _: usize) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, _: DType, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![data.to_vec()])
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

/// How a process joins its group. [`InitOptions::from_env`] reads the variables `torchrun`
/// sets: `RANK`, `WORLD_SIZE`, `MASTER_ADDR` (default `127.0.0.1`), `MASTER_PORT` (default
/// 29500), and `TESSEL_DIST_TIMEOUT` (seconds, default 300).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitOptions {
    /// This process's rank.
    pub rank: usize,
    /// The number of processes.
    pub world_size: usize,
    /// Where rank 0 listens and the others connect.
    pub master: SocketAddr,
    /// How long joining, and any one collective, may wait for another rank before failing.
    pub timeout: Duration,
}

impl InitOptions {
    /// Rank `rank` of `world_size` meeting at `127.0.0.1:port`, with the default timeout.
    pub fn local(rank: usize, world_size: usize, port: u16) -> InitOptions {
        InitOptions {
            rank,
            world_size,
            master: SocketAddr::from(([127, 0, 0, 1], port)),
            timeout: Duration::from_secs(300),
        }
    }

    /// The options `torchrun`-style environment variables give (see the type's docs); a
    /// process started without them is rank 0 of 1.
    pub fn from_env() -> Result<InitOptions> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let number = |name: &str, default: u64| -> Result<u64> {
            var(name).map_or(Ok(default), |v| {
                v.trim()
                    .parse()
                    .map_err(|_| invalid(format!("{name}={v} is not a whole number")))
            })
        };
        let rank = number("RANK", 0)? as usize;
        let world_size = number("WORLD_SIZE", 1)? as usize;
        let host = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let port = number("MASTER_PORT", 29500)?;
        let port = u16::try_from(port)
            .map_err(|_| invalid(format!("MASTER_PORT={port} is not a port")))?;
        let master = (host.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| invalid(format!("MASTER_ADDR={host} does not resolve")))?;
        Ok(InitOptions {
            rank,
            world_size,
            master,
            timeout: Duration::from_secs(number("TESSEL_DIST_TIMEOUT", 300)?),
        })
    }

    /// The same options with another timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> InitOptions {
        self.timeout = timeout;
        self
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidArgument {
        op: "init_process_group",
        reason,
    }
}

/// The ranks of a data-parallel job and the collectives between them (PyTorch's
/// `torch.distributed` process group).
///
/// Collectives take tensors on any device and return new tensors on the same device: the
/// values move through host memory and the TCP transport (rank 0 reduces, in rank order).
/// Each call realizes its input first; in a world of one they return their input. Every rank must make the same calls in the same
/// order with tensors of the same shape and dtype; a rank that disagrees, exits, or stops
/// answering for the timeout makes the call fail on every rank with
/// [`Error::Collective`], and the group is then unusable.
#[derive(Clone)]
pub struct ProcessGroup {
    collective: Arc<dyn Collective>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ProcessGroup(rank {} of {})",
            self.rank(),
            self.world_size()
        )
    }
}

impl ProcessGroup {
    /// Joins the group `options` describes, waiting for every rank to arrive (up to the
    /// timeout). A world of one needs no network.
    pub fn init(options: &InitOptions) -> Result<ProcessGroup> {
        let InitOptions {
            rank, world_size, ..
        } = *options;
        if world_size == 0 || rank >= world_size {
            return Err(invalid(format!(
                "rank {rank} of a world of {world_size}: ranks run from 0 to WORLD_SIZE - 1"
            )));
        }
        if world_size == 1 {
            return Ok(ProcessGroup::with_collective(Arc::new(Alone)));
        }
        let tcp = TcpCollective::connect(options.master, rank, world_size, options.timeout)?;
        Ok(ProcessGroup::with_collective(Arc::new(tcp)))
    }

    /// [`ProcessGroup::init`] with [`InitOptions::from_env`].
    pub fn from_env() -> Result<ProcessGroup> {
        ProcessGroup::init(&InitOptions::from_env()?)
    }

    /// A group over another transport.
    pub fn with_collective(collective: Arc<dyn Collective>) -> ProcessGroup {
        ProcessGroup { collective }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.collective.rank()
    }

    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.collective.world_size()
    }

    /// The transport.
    pub fn collective(&self) -> &Arc<dyn Collective> {
        &self.collective
    }

    /// `tensor` combined elementwise over every rank by `op` (`f32`, `f64`, `bf16`, `f16`,
    /// `i32`, `i64`; half types sum in `f32` and round once).
    pub fn all_reduce(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor> {
        check_dtype("all_reduce", tensor.dtype(), Some(op))?;
        if self.world_size() == 1 {
            return Ok(tensor.clone());
        }
        let mut bytes = to_bytes(tensor)?;
        self.collective.all_reduce(tensor.dtype(), &mut bytes, op)?;
        from_bytes(bytes, tensor)
    }

    /// Rank `root`'s `tensor` on every rank (each rank passes a tensor of the same shape
    /// and dtype; only the root's values matter).
    pub fn broadcast(&self, tensor: &Tensor, root: usize) -> Result<Tensor> {
        self.check_root("broadcast", root)?;
        movable("broadcast", tensor.dtype())?;
        if self.world_size() == 1 {
            return Ok(tensor.clone());
        }
        let mut bytes = to_bytes(tensor)?;
        self.collective
            .broadcast(tensor.dtype(), &mut bytes, root)?;
        from_bytes(bytes, tensor)
    }

    /// Every rank's `tensor`, in rank order.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>> {
        movable("all_gather", tensor.dtype())?;
        if self.world_size() == 1 {
            return Ok(vec![tensor.clone()]);
        }
        let bytes = to_bytes(tensor)?;
        self.collective
            .all_gather(tensor.dtype(), &bytes)?
            .into_iter()
            .map(|b| from_bytes(b, tensor))
            .collect()
    }

    /// This rank's part of `tensor` reduced over every rank: dim 0 is split into
    /// `world_size` equal parts and rank `r` gets part `r` (PyTorch's
    /// `reduce_scatter_tensor`). The whole tensor is reduced, then split.
    pub fn reduce_scatter(&self, tensor: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let world = self.world_size();
        let rows = tensor.dims().first().copied().unwrap_or(0);
        if tensor.ndim() == 0 || !rows.is_multiple_of(world) {
            return Err(Error::InvalidArgument {
                op: "reduce_scatter",
                reason: format!(
                    "dim 0 of {} must split into {world} equal parts (one per rank); pad it to a multiple of {world}",
                    tensor.shape()
                ),
            });
        }
        let part = rows / world;
        Ok(self
            .all_reduce(tensor, op)?
            .narrow(0, (self.rank() * part) as i64, part as i64)?
            .contiguous())
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.collective.barrier()
    }

    fn check_root(&self, op: &'static str, root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "root {root} is not a rank of a world of {}",
                    self.world_size()
                ),
            });
        }
        Ok(())
    }
}

/// The tensor's elements as little-endian bytes (realizing it).
pub(crate) fn to_bytes(tensor: &Tensor) -> Result<Vec<u8>> {
    fn bytes<T: Element>(t: &Tensor) -> Result<Vec<u8>> {
        let values = t.to_vec::<T>()?;
        let mut out = Vec::with_capacity(values.len() * std::mem::size_of::<T>());
        for v in values {
            v.write_le(&mut out);
        }
        Ok(out)
    }
    match tensor.dtype() {
        DType::F32 => bytes::<f32>(tensor),
        DType::F64 => bytes::<f64>(tensor),
        DType::BF16 => bytes::<bf16>(tensor),
        DType::F16 => bytes::<f16>(tensor),
        DType::I32 => bytes::<i32>(tensor),
        DType::I64 => bytes::<i64>(tensor),
        DType::U8 => bytes::<u8>(tensor),
        DType::Bool => bytes::<bool>(tensor),
        other => {
            movable("collective", other)?;
            Err(Error::Internal(format!(
                "no conversion of movable {other} to bytes"
            )))
        }
    }
}

/// Checks that tensors of `dtype` can move between ranks.
fn movable(op: &'static str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32
        | DType::F64
        | DType::BF16
        | DType::F16
        | DType::I32
        | DType::I64
        | DType::U8
        | DType::Bool => Ok(()),
        other => Err(Error::InvalidArgument {
            op,
            reason: format!(
                "{other} tensors are not sent between ranks; cast to f32, f64, bf16, f16, i32, i64, u8 or bool"
            ),
        }),
    }
}

/// A tensor of `like`'s shape, dtype and device holding `bytes`.
pub(crate) fn from_bytes(bytes: Vec<u8>, like: &Tensor) -> Result<Tensor> {
    from_bytes_on(bytes, like.dtype(), &like.dims(), &like.device())
}

pub(crate) fn from_bytes_on(
    bytes: Vec<u8>,
    dtype: DType,
    dims: &[usize],
    device: &Device,
) -> Result<Tensor> {
    Tensor::from_host_bytes(HostBytes::from(bytes), dtype, dims.to_vec(), device)
}
