//! A seeded fuzzing campaign over the public API: random calls from 14 op families on
//! random tensors (every dtype, ranks 0 to 8, empty and size-1 dims, bad axes, sizes past
//! any memory), each result realized and read back. A call may return `Err`; it may not
//! panic, abort the process or hang. Broadcast `add`, `sub`, `mul` and `maximum` results on
//! exact dtypes are spot-checked against `f64`, and so are `abs`/`neg`/`relu`/`round`,
//! `sum`/`max` over axes, `permute`, `transpose` and `flip`.
//!
//! The campaign runs in child processes (this test binary again, running only
//! [`fuzz_child`]), so an abort is caught and attributed to the call that caused it: each
//! call is written to the child's stdout before it runs, and a panic inside a call is caught
//! (`catch_unwind`) and reported without ending the child. Kernels run in the reference
//! interpreter (`TESSEL_CC` names no compiler), so thousands of distinct small kernels cost
//! no compiles.
//!
//! `cargo test` runs [`fuzz_public_api`]: seed 1, a budget of `TESSEL_FUZZ_SECONDS` (default
//! 60 s). `cargo xtask fuzz --minutes N [--seed S]` runs it at length, in release. A failure
//! names the call's family, shape, dtype and generator state; `TESSEL_FUZZ_CHILD=1
//! TESSEL_FUZZ_STATE=<state> cargo test -p tessel-tensor --test fuzz fuzz_child --
//! --nocapture` replays that one call.

use std::io::{BufRead, BufReader, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tessel_tensor::{Conv2dOptions, DType, Device, PoolOptions, Tensor, Var, load_safetensors};

/// Calls per child process.
const CALLS_PER_CHILD: u64 = 400;

/// The child's address space, in KiB (`ulimit -v`): an allocation past it fails, so a
/// size that would fit the machine but not this limit tests the same fallible paths as one
/// past any memory, quickly.
const CHILD_ADDRESS_SPACE_KIB: u64 = 6 << 20;

/// A call running longer than this is a hang.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The testkit's seeded generator, with the draws the campaign makes.
struct Rng(tessel_testkit::Rng);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// An axis, mostly in range, sometimes negative, sometimes out of range.
    fn axis(&mut self, rank: usize) -> i64 {
        let r = rank as i64;
        match self.below(10) {
            0 => r + self.below(3) as i64,
            1 => -r - 1 - self.below(3) as i64,
            2..=4 if r > 0 => -(self.below(rank as u64) as i64) - 1,
            _ => self.below(rank.max(1) as u64) as i64,
        }
    }

    /// A size: small mostly, sometimes 0, sometimes past any memory (never one that fits
    /// memory but takes the interpreter minutes).
    fn size(&mut self) -> usize {
        match self.below(40) {
            0 => 1 << 40,
            1 => usize::MAX / 3,
            2..=6 => 0,
            7..=14 => 1,
            _ => 2 + self.below(4) as usize,
        }
    }

    fn shape(&mut self) -> Vec<usize> {
        let rank = match self.below(12) {
            0 => 0,
            1 => 7 + self.below(2) as usize,
            _ => 1 + self.below(4) as usize,
        };
        // High ranks keep their sizes at 2 or below (or past memory), so no operand of
        // up to 5⁸ elements sends the interpreter into a minutes-long sort.
        let high = rank > 4;
        (0..rank)
            .map(|_| match self.size() {
                n if high && (3..=5).contains(&n) => 2,
                n => n,
            })
            .collect()
    }

    fn dtype(&mut self) -> DType {
        self.pick(&[
            DType::F32,
            DType::F32,
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::F8E4M3,
            DType::F8E5M2,
            DType::I32,
            DType::I64,
            DType::I8,
            DType::U8,
            DType::U32,
            DType::Bool,
        ])
    }

    fn scalar(&mut self) -> f64 {
        self.pick(&[
            0.0,
            1.0,
            -1.0,
            2.5,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            1e300,
            7.0,
        ])
    }
}

/// A random tensor: data from the seeded generator (cast to `dtype`) when it is small,
/// else a constant of that shape, realized (an allocation that must fail as an `Err`: a
/// lazy constant past memory would be a valid operand that a reduction could spend hours
/// reading).
fn tensor(rng: &mut Rng, shape: &[usize], dtype: DType) -> tessel_tensor::Result<Tensor> {
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match numel {
        Some(n) if n <= 4096 => {
            let data: Vec<f32> = (0..n)
                .map(|_| (rng.below(2001) as f32 - 1000.0) / 100.0)
                .collect();
            Ok(Tensor::from_vec(data, shape)?.cast(dtype))
        }
        _ => {
            let t = Tensor::full(shape.to_vec(), 1.5f32, dtype).contiguous();
            t.realize()?;
            Ok(t)
        }
    }
}

/// An index tensor of `shape` with values in `-2..bound + 2`.
fn indices(rng: &mut Rng, shape: &[usize], bound: usize) -> tessel_tensor::Result<Tensor> {
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match numel {
        Some(n) if n <= 4096 => {
            let data: Vec<i64> = (0..n)
                .map(|_| rng.below(bound as u64 + 4) as i64 - 2)
                .collect();
            Tensor::from_vec(data, shape)
        }
        _ => Ok(Tensor::full(shape.to_vec(), 0i64, DType::I64)),
    }
}

/// `t`'s elements as `f64`, where its dtype holds the generated values exactly (f32, f64,
/// i32, i64) and it is small.
fn exact_values(t: &Tensor) -> tessel_tensor::Result<Option<Vec<f64>>> {
    let exact = matches!(t.dtype(), DType::F32 | DType::F64 | DType::I32 | DType::I64);
    if !exact || t.numel() > 4096 {
        return Ok(None);
    }
    Ok(Some(t.cast(DType::F64).to_vec::<f64>()?))
}

/// Checks `out = f(x, y)` (broadcast) against `f` in `f64` where both operands share a dtype
/// whose values are exact: `f32` results within their rounding (2⁻²³ relative), integers
/// exactly. A wrong element panics, which the campaign reports with the call.
fn spot_check(
    x: &Tensor,
    y: &Tensor,
    out: &Tensor,
    f: fn(f64, f64) -> f64,
) -> tessel_tensor::Result<()> {
    if x.dtype() != y.dtype() || out.dtype() != x.dtype() {
        return Ok(());
    }
    let (Some(xs), Some(ys), Some(got)) = (exact_values(x)?, exact_values(y)?, exact_values(out)?)
    else {
        return Ok(());
    };
    let (xd, yd, od) = (x.dims(), y.dims(), out.dims());
    // The element of an operand of dims `d` that broadcasts to output index `flat`.
    let source = |d: &[usize], flat: usize| {
        let mut rest = flat;
        let (mut at, mut stride) = (0, 1);
        for k in (0..od.len()).rev() {
            let i = rest % od[k];
            rest /= od[k];
            if let Some(j) = (k + d.len()).checked_sub(od.len()) {
                if d[j] != 1 {
                    at += i * stride;
                }
                stride *= d[j];
            }
        }
        at
    };
    for (i, g) in got.iter().enumerate() {
        let want = f(xs[source(&xd, i)], ys[source(&yd, i)]);
        let allowed = if x.dtype() == DType::F32 {
            want.abs() * 2f64.powi(-23)
        } else {
            0.0
        };
        assert!(
            (g - want).abs() <= allowed,
            "wrong result: element {i} of {od:?} is {g}, want {want} ({} of {xd:?} and {yd:?})",
            x.dtype()
        );
    }
    Ok(())
}

/// Row-major coordinates of element `flat` of `dims`.
fn coords(dims: &[usize], mut flat: usize) -> Vec<usize> {
    let mut c = vec![0; dims.len()];
    for k in (0..dims.len()).rev() {
        c[k] = flat % dims[k];
        flat /= dims[k];
    }
    c
}

/// The row-major position of `c` in `dims`.
fn position(dims: &[usize], c: &[usize]) -> usize {
    c.iter().zip(dims).fold(0, |at, (&i, &d)| at * d + i)
}

/// An axis argument as the op normalizes it, if it is valid for `rank`.
fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank.max(1) as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Checks an elementwise unary result against `f` in f64, exactly, on exact dtypes.
fn spot_check_unary(x: &Tensor, out: &Tensor, f: fn(f64) -> f64) -> tessel_tensor::Result<()> {
    if out.dtype() != x.dtype() {
        return Ok(());
    }
    let (Some(xs), Some(got)) = (exact_values(x)?, exact_values(out)?) else {
        return Ok(());
    };
    for (i, (g, v)) in got.iter().zip(&xs).enumerate() {
        let want = f(*v);
        assert!(
            *g == want || (g.is_nan() && want.is_nan()),
            "wrong result: element {i} is {g}, want {want} ({} {:?})",
            x.dtype(),
            x.dims()
        );
    }
    Ok(())
}

/// Checks a movement result exactly: element `c` of `out` is `x` at `source(c)`.
fn spot_check_moved(
    x: &Tensor,
    out: &Tensor,
    source: &dyn Fn(&[usize]) -> Vec<usize>,
) -> tessel_tensor::Result<()> {
    let (Some(xs), Some(got)) = (exact_values(x)?, exact_values(out)?) else {
        return Ok(());
    };
    let (xd, od) = (x.dims(), out.dims());
    for (i, g) in got.iter().enumerate() {
        let want = xs[position(&xd, &source(&coords(&od, i)))];
        assert!(
            *g == want || (g.is_nan() && want.is_nan()),
            "wrong result: element {i} of {od:?} is {g}, want {want} (moved from {xd:?})"
        );
    }
    Ok(())
}

/// Checks `sum` or `max` over `axes` (kept or not): integer sums and every max exactly,
/// f32/f64 sums within `n` roundings of the sum of magnitudes.
fn spot_check_reduce(
    x: &Tensor,
    out: &Tensor,
    axes: &[i64],
    keep: bool,
    max: bool,
) -> tessel_tensor::Result<()> {
    let rank = x.dims().len();
    let mut reduced: Vec<usize> = axes.iter().filter_map(|&a| norm_axis(a, rank)).collect();
    reduced.sort_unstable();
    reduced.dedup();
    if axes.is_empty() || reduced.len() != axes.len() || rank == 0 || x.numel() == 0 {
        return Ok(());
    }
    let (Some(xs), Some(got)) = (exact_values(x)?, exact_values(out)?) else {
        return Ok(());
    };
    let xd = x.dims();
    let kept: Vec<usize> = (0..rank).filter(|k| !reduced.contains(k)).collect();
    let od: Vec<usize> = if keep {
        (0..rank)
            .map(|k| if reduced.contains(&k) { 1 } else { xd[k] })
            .collect()
    } else {
        kept.iter().map(|&k| xd[k]).collect()
    };
    assert!(
        od == out.dims(),
        "wrong shape: {xd:?} reduced over {axes:?} (keep {keep}) is {:?}, want {od:?}",
        out.dims()
    );
    let n = got.len();
    let mut want = vec![if max { f64::NEG_INFINITY } else { 0.0 }; n];
    let mut magnitude = vec![0.0f64; n];
    for (i, v) in xs.iter().enumerate() {
        let c = coords(&xd, i);
        let oc: Vec<usize> = if keep {
            (0..rank)
                .map(|k| if reduced.contains(&k) { 0 } else { c[k] })
                .collect()
        } else {
            kept.iter().map(|&k| c[k]).collect()
        };
        let at = position(&od, &oc);
        want[at] = if max { want[at].max(*v) } else { want[at] + v };
        magnitude[at] += v.abs();
    }
    let float = x.dtype().is_float();
    let count = (xs.len() / n.max(1)) as f64;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let allowed = if float && !max {
            count * magnitude[i] * 2f64.powi(-23)
        } else {
            0.0
        };
        assert!(
            (g - w).abs() <= allowed || (g.is_nan() && w.is_nan()),
            "wrong result: {} over {axes:?} of {xd:?} {}: element {i} is {g}, want {w}",
            if max { "max" } else { "sum" },
            x.dtype()
        );
    }
    Ok(())
}

/// Reads `t` back when it is small enough to hold (a result past memory must be an `Err`
/// from the read, which is what reading a huge one checks).
fn consume(t: &Tensor) -> tessel_tensor::Result<()> {
    t.realize()?;
    let _ = t.to_scalars()?;
    Ok(())
}

/// One random call; returns its description (printed before it runs) and runs it.
fn call(rng: &mut Rng, log: &mut impl Write) -> tessel_tensor::Result<()> {
    let mark = rng.0.0;
    let family = rng.below(14);
    let shape = rng.shape();
    let dtype = rng.dtype();
    let rank = shape.len();
    let _ = writeln!(
        log,
        "CALL family {family} shape {shape:?} {dtype} (rng {mark:#x})"
    );
    let _ = log.flush();
    let x = tensor(rng, &shape, dtype)?;
    let out: Vec<Tensor> = match family {
        // Creation.
        0 => match rng.below(6) {
            0 => vec![Tensor::zeros(shape.clone(), dtype)],
            1 => vec![Tensor::eye(rng.size())],
            2 => vec![Tensor::arange(0.0, rng.scalar(), rng.scalar())?],
            3 => vec![Tensor::randn(shape.clone(), dtype)?],
            4 => vec![Tensor::rand(shape.clone(), dtype)?],
            _ => vec![Tensor::linspace(0.0, rng.scalar(), rng.size())],
        },
        // Elementwise, unary and casts.
        1 => {
            let op = rng.below(8);
            let out = match op {
                0 => x.abs()?,
                1 => x.neg()?,
                2 => x.relu(),
                3 => x.sigmoid(),
                4 => x.cast(rng.dtype()),
                5 => x.bitcast(rng.dtype())?,
                6 => x.softplus(rng.scalar(), rng.scalar())?,
                _ => x.round()?,
            };
            let exact: Option<fn(f64) -> f64> = match op {
                0 => Some(f64::abs),
                1 => Some(|v| -v),
                2 => Some(|v| v.max(0.0)),
                7 => Some(f64::round_ties_even),
                _ => None,
            };
            if let Some(f) = exact {
                spot_check_unary(&x, &out, f)?;
            }
            vec![out]
        }
        // Elementwise, binary with broadcasting.
        2 => {
            let other_shape = if rng.chance(50) {
                shape.clone()
            } else {
                rng.shape()
            };
            // Same dtypes half the time, so the spot check below applies often.
            let other_dtype = if rng.chance(50) { dtype } else { rng.dtype() };
            let y = tensor(rng, &other_shape, other_dtype)?;
            let op = rng.below(9);
            let out = match op {
                0 => x.add(&y)?,
                1 => x.sub(&y)?,
                2 => x.mul(&y)?,
                3 => x.div(&y)?,
                4 => x.remainder(&y)?,
                5 => x.pow(&y)?,
                6 => x.maximum(&y)?,
                7 => x.lt(&y)?,
                _ => x.bitwise_and(&y)?,
            };
            let exact: Option<fn(f64, f64) -> f64> = match op {
                0 => Some(|a, b| a + b),
                1 => Some(|a, b| a - b),
                2 => Some(|a, b| a * b),
                6 => Some(f64::max),
                _ => None,
            };
            if let Some(f) = exact {
                spot_check(&x, &y, &out, f)?;
            }
            vec![out]
        }
        // Reductions.
        3 => {
            let axes: Vec<i64> = (0..rng.below(3)).map(|_| rng.axis(rank)).collect();
            let keep = rng.chance(50);
            vec![match rng.below(8) {
                0 => {
                    let out = x.sum(&axes, keep)?;
                    spot_check_reduce(&x, &out, &axes, keep, false)?;
                    out
                }
                1 => x.mean(&axes, keep)?,
                2 => {
                    let out = x.max(&axes, keep)?;
                    spot_check_reduce(&x, &out, &axes, keep, true)?;
                    out
                }
                3 => x.prod(&axes, keep)?,
                4 => x.argmax(rng.axis(rank), keep)?,
                5 => x.var(&axes, keep)?,
                6 => x.logsumexp(&axes, keep)?,
                _ => x.sum_all()?,
            }]
        }
        // Movement.
        4 => {
            let a = rng.axis(rank);
            let b = rng.axis(rank);
            match rng.below(12) {
                0 => {
                    let target: Vec<i64> = (0..rng.below(4))
                        .map(|_| rng.pick(&[-1, 0, 1, 2, 3, 6, i64::MAX]))
                        .collect();
                    vec![x.reshape(&target)?]
                }
                1 => {
                    let perm: Vec<i64> = (0..rank).map(|_| rng.axis(rank)).collect();
                    let out = x.permute(&perm)?;
                    let axes: Vec<usize> =
                        perm.iter().filter_map(|&p| norm_axis(p, rank)).collect();
                    if axes.len() == rank {
                        spot_check_moved(&x, &out, &|c| {
                            let mut src = vec![0; rank];
                            for (k, &p) in axes.iter().enumerate() {
                                src[p] = c[k];
                            }
                            src
                        })?;
                    }
                    vec![out]
                }
                2 => {
                    let out = x.transpose(a, b)?;
                    if let (Some(a), Some(b)) = (norm_axis(a, rank), norm_axis(b, rank))
                        && rank > 0
                    {
                        spot_check_moved(&x, &out, &|c| {
                            let mut src = c.to_vec();
                            src.swap(a, b);
                            src
                        })?;
                    }
                    vec![out]
                }
                3 => vec![x.narrow(a, rng.axis(3), rng.axis(3))?],
                4 => {
                    let sizes: Vec<i64> = (0..rank).map(|_| rng.size() as i64).collect();
                    vec![x.expand(&sizes)?]
                }
                5 => {
                    let out = x.flip(&[a])?;
                    let dims = x.dims();
                    if let Some(k) = norm_axis(a, rank).filter(|_| rank > 0) {
                        spot_check_moved(&x, &out, &|c| {
                            let mut src = c.to_vec();
                            src[k] = dims[k] - 1 - c[k];
                            src
                        })?;
                    }
                    vec![out]
                }
                6 => {
                    let reps: Vec<usize> = (0..rank).map(|_| rng.size()).collect();
                    vec![x.repeat(&reps)?]
                }
                7 => vec![x.repeat_interleave(rng.size(), a)?],
                8 => vec![x.roll(&[rng.axis(5)], &[a])?],
                9 => {
                    let pads: Vec<(i64, i64)> = (0..rng.below(3))
                        .map(|_| (rng.axis(3), rng.axis(3)))
                        .collect();
                    vec![x.pad(&pads, 0.0)?]
                }
                10 => vec![x.diagonal(rng.pick(&[0, 1, -1, i64::MIN, i64::MAX]), a, b)?],
                _ => x.split(rng.size(), a)?,
            }
        }
        // Indexing.
        5 => {
            let a = rng.axis(rank);
            let bound = shape.first().copied().unwrap_or(1).min(1 << 20);
            let idx_shape = if rng.chance(50) {
                shape.clone()
            } else {
                rng.shape()
            };
            let idx = indices(rng, &idx_shape, bound)?;
            match rng.below(8) {
                0 => vec![x.gather(a, &idx)?],
                1 => {
                    let n = rng.size();
                    vec![x.index_select(a, &indices(rng, &[n], bound)?)?]
                }
                2 => vec![x.take_along_dim(&idx, Some(a))?],
                3 => vec![Tensor::embedding(&x, &idx)?],
                4 => vec![x.scatter_add(a, &idx, &tensor(rng, &idx_shape, dtype)?)?],
                5 => vec![x.masked_fill(&tensor(rng, &idx_shape, DType::Bool)?, rng.scalar())?],
                6 => vec![x.nonzero()?],
                _ => vec![idx.one_hot(rng.size())?],
            }
        }
        // Products.
        6 => {
            let other_shape = rng.shape();
            let y = tensor(rng, &other_shape, dtype)?;
            vec![match rng.below(4) {
                0 => x.matmul(&y)?,
                1 => x.bmm(&y)?,
                2 => x.outer(&y)?,
                _ => Tensor::einsum(
                    rng.pick(&["ij,jk->ik", "i,i->", "bij->bji", "ii->i", "a"]),
                    &[&x, &y],
                )?,
            }]
        }
        // Convolution and pooling.
        7 => {
            let w_shape = rng.shape();
            let w = tensor(rng, &w_shape, dtype)?;
            let k = [rng.size().min(1 << 20), rng.size().min(1 << 20)];
            vec![match rng.below(4) {
                0 => x.conv2d(&w, None, &Conv2dOptions::default())?,
                1 => x.max_pool2d(&PoolOptions::new(k))?,
                2 => x.avg_pool2d(&PoolOptions::new(k))?,
                _ => x.interpolate_nearest(&[rng.size(), rng.size()])?,
            }]
        }
        // Sorting.
        8 => {
            let a = rng.axis(rank);
            match rng.below(5) {
                0 => {
                    let (v, i) = x.sort(a, rng.chance(50))?;
                    vec![v, i]
                }
                1 => {
                    let (v, i) = x.topk(rng.size(), a, true, true)?;
                    vec![v, i]
                }
                2 => vec![x.argsort(a, false)?],
                3 => vec![x.unique(true)?],
                _ => {
                    let (v, i) = x.median(a, false)?;
                    vec![v, i]
                }
            }
        }
        // Scans.
        9 => {
            let a = rng.axis(rank);
            vec![match rng.below(3) {
                0 => x.cumsum(a)?,
                1 => x.cumprod(a)?,
                _ => x.logcumsumexp(a)?,
            }]
        }
        // Normalizations.
        10 => {
            let a = rng.axis(rank);
            vec![match rng.below(3) {
                0 => x.softmax(a)?,
                1 => x.log_softmax(a)?,
                _ => x.normalize(rng.scalar(), a, 1e-12)?,
            }]
        }
        // Files: random, truncated and mislabelled safetensors.
        11 => {
            let dir = std::env::temp_dir().join(format!("tessel-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a temporary directory");
            let path = dir.join("f.safetensors");
            let header = format!(
                "{{\"t\":{{\"dtype\":\"{}\",\"shape\":{:?},\"data_offsets\":[0,{}]}}}}",
                rng.pick(&["F32", "BF16", "I64", "BOOL", "X9"]),
                shape,
                rng.size()
            );
            let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
            bytes.extend(header.as_bytes());
            bytes.extend((0..rng.below(64)).map(|i| i as u8));
            if rng.chance(30) {
                bytes.truncate(rng.below(bytes.len() as u64) as usize);
            }
            std::fs::write(&path, &bytes).expect("a temporary file");
            let loaded = load_safetensors(&path, &Device::default());
            let _ = std::fs::remove_dir_all(&dir);
            loaded?.into_iter().map(|(_, t)| t).collect()
        }
        // Gradients of a random op's sum.
        12 => {
            let a = rng.axis(rank);
            let b = rng.axis(rank);
            let y = match rng.below(8) {
                0 => x.softmax(a)?,
                1 => x.sum(&[a], false)?,
                2 => x.matmul(&x.transpose(a, b)?)?,
                3 => x.max(&[a], true)?,
                4 => x.cumsum(a)?,
                5 => {
                    let bound = shape
                        .get(a.rem_euclid(rank.max(1) as i64) as usize)
                        .copied();
                    x.gather(a, &indices(rng, &shape, bound.unwrap_or(1).min(1 << 20))?)?
                }
                6 => x.pad(&[(1, 2)], 0.0)?.flip(&[a])?,
                _ => x.sigmoid().mul(&x)?,
            };
            let loss = y.cast(DType::F32).sum_all()?;
            tessel_tensor::grad(&loss, &[&x])?
        }
        // Dynamic dims.
        _ => {
            let (lo, hi) = (rng.axis(4) - 1, rng.size() as i64);
            let var = Var::new("fuzz", lo, hi)?;
            let t = x.mark_dynamic(rng.below(rank as u64 + 2) as usize, var)?;
            let _ = t.dims();
            vec![(&t + 1.0)?]
        }
    };
    for t in &out {
        consume(t)?;
    }
    Ok(())
}

/// The child side: `TESSEL_FUZZ_CHILD=<seed>` runs [`CALLS_PER_CHILD`] calls from that
/// seed, printing each before it runs, then a summary line. Without the variable (a plain
/// `cargo test`), it does nothing.
#[test]
fn fuzz_child() {
    let Some(seed) = std::env::var("TESSEL_FUZZ_CHILD")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    else {
        return;
    };
    // `TESSEL_FUZZ_STATE=<rng state>` (printed with each call) replays that one call.
    let replay = std::env::var("TESSEL_FUZZ_STATE")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok());
    // Panics are counted here, not printed by the default hook with a backtrace (a replay
    // keeps the hook, and its backtrace).
    if replay.is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    let mut out = std::io::stdout().lock();
    let mut rng = Rng(tessel_testkit::Rng(replay.unwrap_or(seed)));
    let calls = if replay.is_some() { 1 } else { CALLS_PER_CHILD };
    let (mut ok, mut err, mut panics) = (0, 0, 0);
    for _ in 0..calls {
        match catch_unwind(AssertUnwindSafe(|| call(&mut rng, &mut out))) {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => {
                err += 1;
                if replay.is_some() {
                    let _ = writeln!(out, "ERR {e}");
                }
            }
            Err(payload) => {
                panics += 1;
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                let _ = writeln!(out, "PANIC {}", message.replace('\n', " "));
            }
        }
    }
    let _ = writeln!(out, "SUMMARY ok {ok} err {err} panics {panics}");
}

/// Totals of a campaign.
#[derive(Default, Debug)]
struct Campaign {
    calls: u64,
    ok: u64,
    err: u64,
    /// Each panic and abort, with the call that caused it.
    failures: Vec<String>,
}

/// Runs children from `seed` on until `budget` is spent.
fn campaign(seed: u64, budget: Duration) -> Campaign {
    let exe = std::env::current_exe().expect("the test binary's path");
    let started = Instant::now();
    let mut totals = Campaign::default();
    let mut next = seed;
    while started.elapsed() < budget {
        // Through `sh` for `ulimit -v`: the limit applies to the child alone.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -v {CHILD_ADDRESS_SPACE_KIB} && exec \"$0\" fuzz_child --exact --nocapture --test-threads 1"
            ))
            .arg(&exe)
            .env("TESSEL_FUZZ_CHILD", next.to_string())
            .env("TESSEL_CC", "/nonexistent/tessel-fuzz-cc")
            .env("TESSEL_CACHE_DIR", std::env::temp_dir().join("tessel-fuzz-cache"))
            .env("TESSEL_PLAN_CACHE", "0")
            .env_remove("TESSEL_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("a child test process");
        let stdout = child.stdout.take().expect("piped stdout");
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let mut last_call = String::new();
        let mut summary = None;
        loop {
            match received.recv_timeout(CALL_TIMEOUT) {
                Ok(line) => {
                    // The harness's "test fuzz_child ... " has no newline before the
                    // first call.
                    if let Some(at) = line.find("CALL ") {
                        line[at..].clone_into(&mut last_call);
                        totals.calls += 1;
                    } else if let Some(message) = line.strip_prefix("PANIC ") {
                        totals
                            .failures
                            .push(format!("seed {next}: panic in {last_call}: {message}"));
                    } else if let Some(rest) = line.strip_prefix("SUMMARY ") {
                        summary = Some(rest.to_owned());
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    totals.failures.push(format!(
                        "seed {next}: no progress in {} s (a hang) in {last_call}",
                        CALL_TIMEOUT.as_secs()
                    ));
                    break;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        let status = child.wait().expect("the child's exit status");
        match summary {
            Some(s) if status.success() => {
                let field = |name: &str| {
                    s.split_whitespace()
                        .skip_while(|w| *w != name)
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                totals.ok += field("ok");
                totals.err += field("err");
            }
            _ => totals.failures.push(format!(
                "seed {next}: the process ended ({status}) in {last_call}"
            )),
        }
        next = next.wrapping_add(1);
    }
    totals
}

#[test]
fn fuzz_public_api() {
    if std::env::var("TESSEL_FUZZ_CHILD").is_ok() {
        return;
    }
    let seconds = std::env::var("TESSEL_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed = std::env::var("TESSEL_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let totals = campaign(seed, Duration::from_secs(seconds));
    eprintln!(
        "fuzz: {} calls from seed {seed} in {seconds} s: {} ok, {} errors, {} panics or aborts",
        totals.calls,
        totals.ok,
        totals.err,
        totals.failures.len()
    );
    assert!(totals.calls > 0, "no call ran");
    assert!(
        totals.failures.is_empty(),
        "{} panics or aborts:\n{}",
        totals.failures.len(),
        totals.failures.join("\n")
    );
}
