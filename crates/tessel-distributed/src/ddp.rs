//! [`DistributedDataParallel`]: the same model on every rank, each training on its own part
//! of the batch, gradients averaged before every optimizer step.

use std::sync::mpsc;

use tessel_nn::optim::Optimizer;
use tessel_tensor::{DType, Error, Result, Tensor};

use crate::group::{ProcessGroup, from_bytes_on, to_bytes};
use crate::reduce::ReduceOp;

/// Gradient bytes per all-reduce by default (PyTorch's `bucket_cap_mb=25`).
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Data-parallel training over a [`ProcessGroup`] (PyTorch's `DistributedDataParallel`).
///
/// [`DistributedDataParallel::new`] copies rank 0's parameters to every rank, so all ranks
/// start equal. Each step, every rank computes the loss of its own samples;
/// [`DistributedDataParallel::step`] takes the gradients, averages them over the ranks and
/// lets the optimizer apply the average, so every rank takes the same step and the
/// parameters stay equal: training on `n` ranks with `b` samples each is training on one
/// rank with the `n·b` samples (within `f32` reduction order), when the loss is a mean.
///
/// Gradients travel in buckets of about [`DEFAULT_BUCKET_BYTES`], one dtype each, filled
/// from the last parameter to the first (the order a backward pass finishes them). The
/// gradients are computed in one plan; then bucket `k`'s all-reduce runs on a
/// communication thread while bucket `k + 1` is read from the device, and the averages
/// return to each parameter's device.
#[derive(Debug)]
pub struct DistributedDataParallel {
    group: ProcessGroup,
    params: Vec<Tensor>,
    /// Parameter indices per bucket, in reduction order.
    buckets: Vec<Vec<usize>>,
}

impl DistributedDataParallel {
    /// Wraps `params` (a model's [`parameters`](tessel_nn::Module::parameters)), assigning
    /// rank 0's values to every rank's parameters, with buckets of
    /// [`DEFAULT_BUCKET_BYTES`].
    pub fn new(group: &ProcessGroup, params: Vec<Tensor>) -> Result<Self> {
        Self::with_bucket_bytes(group, params, DEFAULT_BUCKET_BYTES)
    }

    /// [`DistributedDataParallel::new`] with buckets of about `bucket_bytes` (a parameter
    /// larger than that gets a bucket of its own).
    pub fn with_bucket_bytes(
        group: &ProcessGroup,
        params: Vec<Tensor>,
        bucket_bytes: usize,
    ) -> Result<Self> {
        const OP: &str = "DistributedDataParallel";
        if params.is_empty() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the parameter list is empty; pass model.parameters()".into(),
            });
        }
        for (i, p) in params.iter().enumerate() {
            if !p.dtype().is_float() || p.shape().as_usizes().is_none() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "parameter {i} is {} {}; parameters must be floats of a concrete shape",
                        p.shape(),
                        p.dtype()
                    ),
                });
            }
        }
        let sizes: Vec<(DType, usize)> = params
            .iter()
            .map(|p| (p.dtype(), p.numel() * p.dtype().size_bytes()))
            .collect();
        let ddp = DistributedDataParallel {
            group: group.clone(),
            buckets: buckets(&sizes, bucket_bytes.max(1)),
            params,
        };
        ddp.broadcast_parameters()?;
        Ok(ddp)
    }

    /// The group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// The parameters.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The parameter indices of each bucket, in the order they are reduced.
    pub fn buckets(&self) -> &[Vec<usize>] {
        &self.buckets
    }

    /// Gives every rank rank 0's parameter values (what `new` does; call it again after
    /// loading a checkpoint on rank 0 only).
    pub fn broadcast_parameters(&self) -> Result<()> {
        if self.group.world_size() == 1 {
            return Ok(());
        }
        for bucket in &self.buckets {
            let members: Vec<&Tensor> = bucket.iter().map(|&i| &self.params[i]).collect();
            let dtype = members[0].dtype();
            let mut bytes = flatten(&members)?;
            self.group.collective().broadcast(dtype, &mut bytes, 0)?;
            for (p, value) in members.iter().zip(unflatten(&bytes, &members)?) {
                p.assign(&value)?;
            }
        }
        Ok(())
    }

    /// `grads` (one per parameter, in order) averaged over every rank, computing
    /// `also_realize` (the loss) in the same plan as the gradients.
    pub fn reduce_gradients(
        &self,
        grads: &[Tensor],
        also_realize: &[&Tensor],
    ) -> Result<Vec<Tensor>> {
        const OP: &str = "DistributedDataParallel::reduce_gradients";
        if grads.len() != self.params.len() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "{} gradients for {} parameters; pass one per parameter, in order",
                    grads.len(),
                    self.params.len()
                ),
            });
        }
        for (i, (g, p)) in grads.iter().zip(&self.params).enumerate() {
            if g.dims() != p.dims() || g.dtype() != p.dtype() {
                return Err(Error::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "gradient {i} is {} {}, its parameter {} {}",
                        g.shape(),
                        g.dtype(),
                        p.shape(),
                        p.dtype()
                    ),
                });
            }
        }
        let mut outputs: Vec<&Tensor> = grads.iter().collect();
        outputs.extend_from_slice(also_realize);
        Tensor::realize_all(&outputs)?;
        if self.group.world_size() == 1 {
            return Ok(grads.to_vec());
        }
        let collective = self.group.collective();
        let members =
            |k: usize| -> Vec<&Tensor> { self.buckets[k].iter().map(|&i| &grads[i]).collect() };
        let reduced = pipeline(
            self.buckets.len(),
            |k| flatten(&members(k)),
            |k, mut bytes| {
                let dtype = grads[self.buckets[k][0]].dtype();
                collective.all_reduce(dtype, &mut bytes, ReduceOp::Mean)?;
                Ok(bytes)
            },
        )?;
        let mut out: Vec<Option<Tensor>> = vec![None; grads.len()];
        for (k, bytes) in reduced.into_iter().enumerate() {
            for (&i, value) in self.buckets[k].iter().zip(unflatten(&bytes, &members(k))?) {
                out[i] = Some(value);
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(i, g)| {
                g.ok_or_else(|| Error::Internal(format!("parameter {i} is in no bucket")))
            })
            .collect()
    }

    /// One training step on this rank's scalar `loss`: its gradients with respect to the
    /// parameters, averaged over the ranks, applied by `optimizer` (whose parameters must
    /// be these, in order). The loss is computed in the same plan as the gradients.
    pub fn step<O: Optimizer + ?Sized>(&self, optimizer: &mut O, loss: &Tensor) -> Result<()> {
        const OP: &str = "DistributedDataParallel::step";
        if loss.numel() != 1 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "the loss must be a single value, but it has shape {}",
                    loss.shape()
                ),
            });
        }
        let theirs = optimizer.params();
        if theirs.len() != self.params.len()
            || theirs
                .iter()
                .zip(&self.params)
                .any(|(a, b)| a.dims() != b.dims())
        {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the optimizer's parameters are not the wrapped ones; build both from the same model.parameters()".into(),
            });
        }
        let wrt: Vec<&Tensor> = self.params.iter().collect();
        let grads = loss.backward(&wrt)?;
        let reduced = self.reduce_gradients(&grads, &[loss])?;
        optimizer.apply(&reduced, &[])
    }
}

/// Parameter indices grouped into buckets of at most `cap` bytes of one dtype, from the
/// last parameter to the first.
fn buckets(sizes: &[(DType, usize)], cap: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut open: Vec<(DType, Vec<usize>, usize)> = Vec::new();
    for i in (0..sizes.len()).rev() {
        let (dtype, bytes) = sizes[i];
        let slot = open
            .iter()
            .position(|(d, _, _)| *d == dtype)
            .unwrap_or_else(|| {
                open.push((dtype, Vec::new(), 0));
                open.len() - 1
            });
        let (_, members, filled) = &mut open[slot];
        if !members.is_empty() && *filled + bytes > cap {
            out.push(std::mem::take(members));
            *filled = 0;
        }
        members.push(i);
        *filled += bytes;
    }
    out.extend(
        open.into_iter()
            .map(|(_, m, _)| m)
            .filter(|m| !m.is_empty()),
    );
    out
}

/// `read(k)` for every bucket in order on this thread while `reduce(k, bytes)` runs on a
/// communication thread, each bucket's reduction starting as soon as it is read.
pub(crate) fn pipeline(
    count: usize,
    mut read: impl FnMut(usize) -> Result<Vec<u8>>,
    reduce: impl Fn(usize, Vec<u8>) -> Result<Vec<u8>> + Send,
) -> Result<Vec<Vec<u8>>> {
    std::thread::scope(|scope| {
        let (send, receive) = mpsc::channel::<(usize, Vec<u8>)>();
        let worker = scope.spawn(move || -> Result<Vec<Vec<u8>>> {
            let mut done = Vec::with_capacity(count);
            for (k, bytes) in receive {
                done.push(reduce(k, bytes)?);
            }
            Ok(done)
        });
        let mut read_result = Ok(());
        for k in 0..count {
            match read(k) {
                Ok(bytes) => {
                    if send.send((k, bytes)).is_err() {
                        // The worker stopped on an error: it is reported below.
                        break;
                    }
                }
                Err(e) => {
                    read_result = Err(e);
                    break;
                }
            }
        }
        drop(send);
        let reduced = worker
            .join()
            .map_err(|_| Error::Internal("the communication thread panicked".into()))?;
        read_result?;
        let reduced = reduced?;
        debug_assert_eq!(reduced.len(), count);
        Ok(reduced)
    })
}

/// The tensors' bytes one after another (realizing them).
fn flatten(tensors: &[&Tensor]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for t in tensors {
        out.extend(to_bytes(t)?);
    }
    Ok(out)
}

/// `bytes` cut into tensors like `like` (shapes, dtypes, devices), in order.
fn unflatten(bytes: &[u8], like: &[&Tensor]) -> Result<Vec<Tensor>> {
    let mut out = Vec::with_capacity(like.len());
    let mut at = 0;
    for t in like {
        let n = t.numel() * t.dtype().size_bytes();
        let part = bytes.get(at..at + n).ok_or_else(|| {
            Error::Internal(format!(
                "a bucket of {} bytes is short of {}",
                bytes.len(),
                at + n
            ))
        })?;
        out.push(from_bytes_on(
            part.to_vec(),
            t.dtype(),
            &t.dims(),
            &t.device(),
        )?);
        at += n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn buckets_fill_from_the_last_parameter_by_dtype() {
        let f = |n: usize| (DType::F32, n * 4);
        // 100-byte buckets: [5, 4] = 40 + 40, [3] = 80 (would overflow with 2), [2, 1] =
        // 40 + 40, [0] alone = 400 bytes (larger than a bucket).
        let sizes = [f(100), f(10), f(10), f(20), f(10), f(10)];
        assert_eq!(
            buckets(&sizes, 100),
            vec![vec![5, 4], vec![3], vec![2, 1], vec![0]]
        );
        // Dtypes never share a bucket.
        let mixed = [(DType::BF16, 8), (DType::F32, 8), (DType::BF16, 8)];
        assert_eq!(buckets(&mixed, 1 << 20), vec![vec![2, 0], vec![1]]);
    }

    #[test]
    fn bucket_k_reduces_while_bucket_k_plus_1_is_read() {
        let events = Mutex::new(Vec::<(&str, usize, Instant)>::new());
        let log = |what, k| events.lock().unwrap().push((what, k, Instant::now()));
        let out = pipeline(
            3,
            |k| {
                log("read start", k);
                std::thread::sleep(Duration::from_millis(30));
                log("read end", k);
                Ok(vec![k as u8])
            },
            |k, mut bytes| {
                log("reduce start", k);
                std::thread::sleep(Duration::from_millis(60));
                bytes.push(100);
                log("reduce end", k);
                Ok(bytes)
            },
        )
        .unwrap();
        assert_eq!(out, vec![vec![0, 100], vec![1, 100], vec![2, 100]]);
        let events = events.into_inner().unwrap();
        let at = |what: &str, k: usize| {
            events
                .iter()
                .find(|(w, j, _)| *w == what && *j == k)
                .map(|e| e.2)
                .unwrap()
        };
        // Bucket 0's reduction starts after it is read and before bucket 1 finishes being read.
        assert!(at("reduce start", 0) >= at("read end", 0));
        assert!(at("reduce start", 0) < at("read end", 1));
        // Reductions run in order.
        assert!(at("reduce start", 1) >= at("reduce end", 0));
    }

    #[test]
    fn a_failed_reduction_is_the_error() {
        let result = pipeline(
            4,
            |k| Ok(vec![k as u8]),
            |k, bytes| {
                if k == 1 {
                    Err(Error::Collective {
                        op: "all_reduce",
                        reason: "rank 1 closed its connection".into(),
                    })
                } else {
                    Ok(bytes)
                }
            },
        );
        assert!(matches!(result, Err(Error::Collective { .. })));
    }
}
