//! Library routines a backend may offer in place of a generated kernel.
//!
//! The graph layer recognizes a pattern (a matrix product) and asks each backend for
//! [`VendorOp`] programs through [`Backend::vendor`](crate::Backend::vendor). A backend
//! returns every way it has to run the op as a [`VendorProgram`]: a library routine (the
//! `gemm` crate on the CPU, cuBLAS on CUDA), or a kernel of its own written for the op
//! (CUDA's tensor-core matmul, one program per tile shape). Each launches, times and
//! releases like any compiled kernel; a backend with none returns an empty list, and the
//! generated kernel of the graph is the only candidate. Vendor programs are measured like
//! every other candidate, never assumed faster.
//!
//! Buffers bind positionally, as for kernels: a matmul takes `[lhs, rhs, out]`, and
//! `[lhs, rhs, bias, out]` when its [`Epilogue`] adds a bias; an attention takes
//! `[q, k, v, out]`.

use std::fmt;

use tessel_shape::{Bindings, DType, Dim, EvalError, Scalar};

use crate::ProgramId;

/// One way a backend runs a [`VendorOp`] (see [`Backend::vendor`](crate::Backend::vendor)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VendorProgram {
    /// The program.
    pub program: ProgramId,
    /// What tells it from the other programs for the same op (`"cuBLAS"`,
    /// `"mma 128×256×32/3"`): shown in plans, and part of the key its measured time is
    /// cached under.
    pub variant: String,
    /// Whether two launches on the same inputs give bit-identical results: false where
    /// the program sums floats atomically, in an order the device decides. Plans made
    /// under deterministic algorithms leave out programs where this is false.
    pub deterministic: bool,
}

/// A library operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum VendorOp {
    /// A (batched) matrix product; see [`Matmul`].
    Matmul(Matmul),
    /// Fused scaled dot-product attention; see [`Attention`].
    Attention(Attention),
    /// A piece of an attention's backward pass; see [`AttentionBackward`].
    AttentionBackward(AttentionBackward),
}

impl fmt::Display for VendorOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VendorOp::Matmul(m) => m.fmt(f),
            VendorOp::Attention(a) => a.fmt(f),
            VendorOp::AttentionBackward(a) => a.fmt(f),
        }
    }
}

/// `out[b] = op(lhs[b]) · op(rhs[b])` for `b < batch`, every matrix dense.
///
/// - `out[b]` is row-major `m × n`, at element offset `b·m·n`: `out` is contiguous.
/// - `lhs[b]` is `m × k` at element offset `b·lhs_batch_stride`; row-major (`m` rows of
///   `k`) or, when `lhs_transposed`, stored as its row-major transpose (`k` rows of `m`).
/// - `rhs[b]` is `k × n` at offset `b·rhs_batch_stride`; row-major (`k` rows of `n`) or,
///   when `rhs_transposed`, stored as `n` rows of `k`.
///
/// A batch stride of 0 broadcasts one matrix to every batch. Every operand and the output
/// have element type `dtype`. Sizes are symbolic; a launch evaluates them with its dims.
/// Sums run in `dtype` (the generated kernel does the same), in whatever order the
/// library chooses. With [`allow_tf32`](Matmul::allow_tf32), an `f32` product may round its
/// operands to TF32 instead. An [`Epilogue`] applies to each sum before it is stored.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Matmul {
    /// Element type of the operands and the result.
    pub dtype: DType,
    /// Number of products.
    pub batch: Dim,
    /// Rows of the result.
    pub m: Dim,
    /// Columns of the result.
    pub n: Dim,
    /// The contracted length.
    pub k: Dim,
    /// Whether `lhs` is stored transposed (`k × m`).
    pub lhs_transposed: bool,
    /// Whether `rhs` is stored transposed (`n × k`).
    pub rhs_transposed: bool,
    /// Elements between consecutive `lhs` matrices (0: one matrix for every batch).
    pub lhs_batch_stride: Dim,
    /// Elements between consecutive `rhs` matrices (0: one matrix for every batch).
    pub rhs_batch_stride: Dim,
    /// An `f32` product may round its operands to TF32 (10-bit mantissa) on tensor cores,
    /// still summing in `f32`, as `torch.backends.cuda.matmul.allow_tf32` permits. A
    /// permission: a backend without TF32 computes in full `f32`. Meaningless for other
    /// dtypes.
    pub allow_tf32: bool,
    /// What happens to each sum before it is stored.
    pub epilogue: Epilogue,
}

/// Elementwise work a matmul does on each sum before storing it, in the accumulation
/// precision (at least `f32`), with one rounding to the output dtype at the end:
/// `out[b, i, j] = activation(sum + bias[j])`. The bias, when there is one, is a contiguous
/// vector of `n` elements of the matmul's dtype, bound after the operands and shared by
/// every batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Epilogue {
    /// A bias vector along the output's rows is added.
    pub bias: bool,
    /// The activation applied last.
    pub activation: Activation,
}

impl Epilogue {
    /// No epilogue: the sum is stored as it is.
    pub const NONE: Epilogue = Epilogue {
        bias: false,
        activation: Activation::Identity,
    };

    /// Whether the sum is stored as it is.
    pub fn is_none(&self) -> bool {
        *self == Epilogue::NONE
    }

    /// `activation(sum + bias)` in `f64`, the definition every backend's epilogue is
    /// tested against.
    pub fn apply(&self, sum: f64, bias: f64) -> f64 {
        let x = if self.bias { sum + bias } else { sum };
        self.activation.apply(x)
    }
}

/// An activation a matmul epilogue may apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// None.
    #[default]
    Identity,
    /// `max(x, 0)` (`torch.relu`).
    Relu,
    /// GELU's tanh approximation, `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`
    /// (`torch.nn.functional.gelu(x, approximate="tanh")`, GPT-2's `gelu_new`).
    GeluTanh,
    /// GELU, `x/2 · (1 + erf(x/√2))` (`torch.nn.functional.gelu(x)`, BERT's `gelu`).
    Gelu,
}

impl Activation {
    /// The activation of `x`, in `f64`.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::Identity => x,
            Activation::Relu => x.max(0.0),
            Activation::GeluTanh => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044_715 * x * x * x)).tanh())
            }
            Activation::Gelu => {
                0.5 * x * (1.0 + tessel_shape::erf(x * std::f64::consts::FRAC_1_SQRT_2))
            }
        }
    }
}

impl fmt::Display for Epilogue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bias {
            f.write_str(" + bias")?;
        }
        match self.activation {
            Activation::Identity => Ok(()),
            Activation::Relu => f.write_str(", relu"),
            Activation::GeluTanh => f.write_str(", gelu (tanh)"),
            Activation::Gelu => f.write_str(", gelu"),
        }
    }
}

/// A [`Matmul`] with its sizes evaluated for one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulSizes {
    /// Number of products.
    pub batch: usize,
    /// Rows of the result.
    pub m: usize,
    /// Columns of the result.
    pub n: usize,
    /// The contracted length.
    pub k: usize,
    /// Elements between consecutive `lhs` matrices.
    pub lhs_batch_stride: usize,
    /// Elements between consecutive `rhs` matrices.
    pub rhs_batch_stride: usize,
}

impl MatmulSizes {
    /// Elements each operand must hold at least: `(lhs, rhs, out)`. Saturates instead of
    /// overflowing, so absurd sizes fail a buffer-length check rather than passing it.
    pub fn min_elements(&self) -> (usize, usize, usize) {
        if self.batch == 0 {
            return (0, 0, 0);
        }
        let last = self.batch - 1;
        let mk = self.m.saturating_mul(self.k);
        let kn = self.k.saturating_mul(self.n);
        let span = |stride: usize, one: usize| {
            if one == 0 {
                0
            } else {
                last.saturating_mul(stride).saturating_add(one)
            }
        };
        (
            span(self.lhs_batch_stride, mk),
            span(self.rhs_batch_stride, kn),
            self.batch.saturating_mul(self.m).saturating_mul(self.n),
        )
    }
}

impl Matmul {
    /// The sizes for one launch.
    pub fn sizes(&self, dims: &Bindings) -> Result<MatmulSizes, EvalError> {
        let eval = |d: Dim| d.eval(dims).map(|v| v.max(0) as usize);
        Ok(MatmulSizes {
            batch: eval(self.batch)?,
            m: eval(self.m)?,
            n: eval(self.n)?,
            k: eval(self.k)?,
            lhs_batch_stride: eval(self.lhs_batch_stride)?,
            rhs_batch_stride: eval(self.rhs_batch_stride)?,
        })
    }

    /// Floating-point operations of one launch (`2·batch·m·n·k`).
    pub fn flops(&self, dims: &Bindings) -> Result<f64, EvalError> {
        let s = self.sizes(dims)?;
        Ok(2.0 * s.batch as f64 * s.m as f64 * s.n as f64 * s.k as f64)
    }
}

impl fmt::Display for Matmul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = |b: bool| if b { "ᵀ" } else { "" };
        write!(
            f,
            "matmul {} [{}] {}×{}{} · {}×{}{} (batch strides {}, {})",
            self.dtype,
            self.batch,
            self.m,
            self.k,
            t(self.lhs_transposed),
            self.k,
            self.n,
            t(self.rhs_transposed),
            self.lhs_batch_stride,
            self.rhs_batch_stride
        )?;
        if self.allow_tf32 && self.dtype == DType::F32 {
            f.write_str(" allowing tf32")?;
        }
        self.epilogue.fmt(f)
    }
}

/// `out[b] = softmax(scale · q[b] · k[b]ᵀ + mask) · v[b]` for `b < batch`, the softmax
/// along each row of the `l × s` scores, which are never stored.
///
/// - `q[b]` is row-major `l × e` at element offset `b·q_batch_stride`; pair `b` reads key
///   and value matrix `g = b / kv_group`: `k[g]` is `s × e` at `g·k_batch_stride`, `v[g]`
///   is `s × ev` at `g·v_batch_stride` (a stride of 0 shares one matrix between every
///   pair). A `kv_group` above 1 is grouped-query attention: consecutive query heads share
///   one key/value head.
/// - `out[b]` is row-major `l × ev`, at `b·l·ev`: `out` is contiguous.
/// - With a [`layout`](AttentionLayout), the rows of `q`, `k`, `v` and `out` lie where it
///   says instead (the batch strides are then unused): views of wider buffers, as heads
///   split out of a projection's rows are.
/// - With `causal`, query `i` sees keys `j ≤ i` only (the mask aligned at the top left, as
///   PyTorch's `is_causal`).
/// - With a [`mask`](AttentionMask), its element for pair `b`, query `i` and key `j` is
///   added to the scaled score; buffers then bind as `[q, k, v, mask, out]`.
///
/// Every operand and the output have element type `dtype`. Scores, the softmax and the
/// sums run in at least `f32`; the result is rounded once. A half-precision kernel may
/// round the probabilities to `dtype` before multiplying them by `v` (as flash attention
/// does); the unfused composition rounds the scores too, so the two agree to half
/// precision. A query row that sees no key gives NaN, as the composition does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Attention {
    /// Element type of `q`, `k`, `v` and the result.
    pub dtype: DType,
    /// Number of (batch, head) pairs.
    pub batch: Dim,
    /// Queries per pair.
    pub l: Dim,
    /// Keys (and values) per pair.
    pub s: Dim,
    /// Length of a query or key vector.
    pub e: Dim,
    /// Length of a value vector.
    pub ev: Dim,
    /// Elements between consecutive `q` matrices.
    pub q_batch_stride: Dim,
    /// Elements between consecutive `k` matrices (0: one for every pair).
    pub k_batch_stride: Dim,
    /// Elements between consecutive `v` matrices (0: one for every pair).
    pub v_batch_stride: Dim,
    /// Consecutive pairs sharing one `k` and `v` matrix (1: each pair its own).
    pub kv_group: Dim,
    /// The factor of the scores, as the graph recorded it.
    pub scale: Scalar,
    /// Key `j > i` is hidden from query `i`.
    pub causal: bool,
    /// An additive mask.
    pub mask: Option<AttentionMask>,
    /// Dropout of the probabilities.
    pub dropout: Option<AttentionDropout>,
    /// Where the rows of every operand and of the output lie, when not as the batch
    /// strides say.
    pub layout: Option<Box<AttentionLayout>>,
}

/// Rows of an [`Attention`]'s operands and output read and written in place, as views of
/// wider buffers (`x.view(b, l, heads, e).transpose(1, 2)` of a projection's output, and
/// the output written as `transpose(1, 2).reshape(b, l, heads·ev)` is laid out): pair `p`
/// is `(outer, head) = (p / heads, p % heads)`; for each operand, `[offset, outer, head,
/// row]` strides in elements place row `i` of its matrix for pair `p` at `offset +
/// outer·[1] + head·[2] + i·[3]`, where `k` and `v` count heads as `head / kv_group`.
/// Elements within a row are contiguous.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttentionLayout {
    /// Pairs per outer index (query heads).
    pub heads: Dim,
    /// `q`'s offset and strides.
    pub q: [Dim; 4],
    /// `k`'s.
    pub k: [Dim; 4],
    /// `v`'s.
    pub v: [Dim; 4],
    /// The output's.
    pub out: [Dim; 4],
}

/// An [`AttentionLayout`] evaluated for one launch (also the batch strides' layout, as
/// [`Attention::sizes`] resolves it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLayout {
    /// Pairs per outer index (at least 1).
    pub heads: usize,
    /// `[offset, outer, head, row]` of `q`, `k`, `v` and the output, in elements.
    pub strides: [[usize; 4]; 4],
}

impl RowLayout {
    /// The element offset of row `i` of operand `which` (0 `q`, 1 `k`, 2 `v`, 3 the output)
    /// for pair `pair`, whose key and value heads are grouped by `kv_group`.
    pub fn row(&self, which: usize, pair: usize, kv_group: usize, i: usize) -> usize {
        let [offset, outer, head, row] = self.strides[which];
        let h = pair % self.heads;
        let h = if matches!(which, 1 | 2) {
            h / kv_group
        } else {
            h
        };
        offset + (pair / self.heads) * outer + h * head + i * row
    }
}

/// Dropout of the attention probabilities, as `Tensor::dropout` records it: the
/// probability at row-major position `pos` of the `[batch, l, s]` probabilities is kept
/// (times `scale`) where word `pos mod 4` of the Philox4x32-10 block at counter
/// `(⌊pos / 4⌋, stream)` under `seed` is at least `threshold`, else 0. The draw's key is an
/// operand: a buffer of four `u32`, `[seed_lo, seed_hi, stream_lo, stream_hi]`, bound after
/// the mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionDropout {
    /// Kept where the word is at least this (`round(p · 2³²)`).
    pub threshold: u32,
    /// The factor of a kept probability (`1 / (1 - p)` in the probabilities' dtype).
    pub scale: Scalar,
}

impl AttentionDropout {
    /// Whether the probability at `pos` is kept, under `key`.
    pub fn keeps(&self, key: [u32; 4], pos: u64) -> bool {
        let [block_lo, block_hi] = crate::philox::split(pos / 4);
        let words =
            crate::philox::philox4x32_10([block_lo, block_hi, key[2], key[3]], [key[0], key[1]]);
        words[(pos % 4) as usize] >= self.threshold
    }
}

/// An attention mask, read in place with strides (0 broadcasts): pair `b` is
/// `(outer, head) = (b / heads, b % heads)`, and its value for query `i` and key `j` is
/// `mask[outer·strides[0] + head·strides[1] + i·strides[2] + j·strides[3]]`. A float mask
/// is added to the scaled score; a `bool` mask hides the key where it is true (adds
/// `-inf`), as `masked_fill(mask, -inf)` does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttentionMask {
    /// Element type of the mask (a float, or `bool`).
    pub dtype: DType,
    /// Consecutive pairs under one outer index.
    pub heads: Dim,
    /// Elements per step of the outer index, the head, the query and the key.
    pub strides: [Dim; 4],
}

/// An [`Attention`] with its sizes evaluated for one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionSizes {
    /// Number of (batch, head) pairs.
    pub batch: usize,
    /// Queries per pair.
    pub l: usize,
    /// Keys per pair.
    pub s: usize,
    /// Length of a query or key vector.
    pub e: usize,
    /// Length of a value vector.
    pub ev: usize,
    /// Elements between consecutive `[q, k, v]` matrices.
    pub batch_strides: [usize; 3],
    /// Consecutive pairs sharing one `k` and `v` matrix (at least 1).
    pub kv_group: usize,
    /// Where every row lies ([`Attention::rows`] evaluated).
    pub rows: RowLayout,
    /// The mask's heads per outer index (at least 1) and strides, when there is one.
    pub mask: Option<(usize, [usize; 4])>,
}

impl AttentionSizes {
    /// Elements each buffer must hold at least: `[q, k, v, out]`. Saturates instead of
    /// overflowing, so absurd sizes fail a buffer-length check rather than passing it.
    pub fn min_elements(&self) -> [usize; 4] {
        if self.batch == 0 {
            return [0; 4];
        }
        // The largest row offset is at the last pair, or at the last head of the outer
        // index before it (strides are not negative).
        let last = self.batch - 1;
        let heads = self.rows.heads;
        let mut pairs = vec![last];
        if last / heads > 0 {
            pairs.push((last / heads) * heads - 1);
        }
        let lengths = [
            (self.l, self.e),
            (self.s, self.e),
            (self.s, self.ev),
            (self.l, self.ev),
        ];
        let mut spans = [0; 4];
        for (which, (rows, width)) in lengths.into_iter().enumerate() {
            if rows == 0 || width == 0 {
                continue;
            }
            spans[which] = pairs
                .iter()
                .map(|&p| {
                    let [offset, outer, head, row] = self.rows.strides[which];
                    let h = p % heads;
                    let h = if matches!(which, 1 | 2) {
                        h / self.kv_group
                    } else {
                        h
                    };
                    offset
                        .saturating_add((p / heads).saturating_mul(outer))
                        .saturating_add(h.saturating_mul(head))
                        .saturating_add((rows - 1).saturating_mul(row))
                        .saturating_add(width)
                })
                .max()
                .unwrap_or(0);
        }
        spans
    }

    /// Elements the mask buffer must hold at least (0 without a mask).
    pub fn mask_elements(&self) -> usize {
        let Some((heads, strides)) = self.mask else {
            return 0;
        };
        if self.batch == 0 || self.l == 0 || self.s == 0 {
            return 0;
        }
        let last = [
            (self.batch - 1) / heads,
            heads.min(self.batch) - 1,
            self.l - 1,
            self.s - 1,
        ];
        last.iter().zip(strides).fold(1usize, |acc, (i, st)| {
            acc.saturating_add(i.saturating_mul(st))
        })
    }

    /// The mask's element offset for pair `b`, query `i` and key `j`.
    pub fn mask_offset(&self, b: usize, i: usize, j: usize) -> Option<usize> {
        let (heads, [so, sh, si, sj]) = self.mask?;
        Some((b / heads) * so + (b % heads) * sh + i * si + j * sj)
    }
}

impl Attention {
    /// Where every row lies: the op's [`AttentionLayout`], or the batch strides' layout
    /// (heads `kv_group`, so that `k` and `v` index by the outer pair).
    pub fn rows(&self) -> AttentionLayout {
        if let Some(layout) = &self.layout {
            return (**layout).clone();
        }
        let (zero, g) = (Dim::constant(0), self.kv_group);
        AttentionLayout {
            heads: g,
            q: [zero, g * self.q_batch_stride, self.q_batch_stride, self.e],
            k: [zero, self.k_batch_stride, zero, self.e],
            v: [zero, self.v_batch_stride, zero, self.ev],
            out: [zero, g * self.l * self.ev, self.l * self.ev, self.ev],
        }
    }

    /// The sizes for one launch.
    pub fn sizes(&self, dims: &Bindings) -> Result<AttentionSizes, EvalError> {
        let eval = |d: Dim| d.eval(dims).map(|v| v.max(0) as usize);
        let batch_strides = [
            eval(self.q_batch_stride)?,
            eval(self.k_batch_stride)?,
            eval(self.v_batch_stride)?,
        ];
        let kv_group = eval(self.kv_group)?.max(1);
        let layout = self.rows();
        let four = |s: &[Dim; 4]| -> Result<[usize; 4], EvalError> {
            Ok([eval(s[0])?, eval(s[1])?, eval(s[2])?, eval(s[3])?])
        };
        let rows = RowLayout {
            heads: eval(layout.heads)?.max(1),
            strides: [
                four(&layout.q)?,
                four(&layout.k)?,
                four(&layout.v)?,
                four(&layout.out)?,
            ],
        };
        Ok(AttentionSizes {
            batch: eval(self.batch)?,
            l: eval(self.l)?,
            s: eval(self.s)?,
            e: eval(self.e)?,
            ev: eval(self.ev)?,
            batch_strides,
            kv_group,
            rows,
            mask: match &self.mask {
                Some(m) => Some((
                    eval(m.heads)?.max(1),
                    [
                        eval(m.strides[0])?,
                        eval(m.strides[1])?,
                        eval(m.strides[2])?,
                        eval(m.strides[3])?,
                    ],
                )),
                None => None,
            },
        })
    }

    /// The result in `f64` from operands read as `f64` (the definition every backend's
    /// program is tested against): `out` as the layout places it (`batch·l·ev` elements
    /// with the batch strides; with an [`AttentionLayout`], what
    /// [`AttentionSizes::min_elements`] asks, 0 where no row lands). `mask` is ignored without
    /// an [`AttentionMask`], `key` (the draw's key operand) without an [`AttentionDropout`].
    pub fn reference(
        &self,
        s: &AttentionSizes,
        [q, k, v, mask]: [&[f64]; 4],
        key: [u32; 4],
    ) -> Vec<f64> {
        let scale = self.scale.to_f64();
        let (rows, group) = (&s.rows, s.kv_group);
        let mut out = vec![0.0; s.min_elements()[3]];
        let mut scores = vec![0.0; s.s];
        for b in 0..s.batch {
            for i in 0..s.l {
                let qi = &q[rows.row(0, b, group, i)..][..s.e];
                for (j, score) in scores.iter_mut().enumerate() {
                    let kj = &k[rows.row(1, b, group, j)..][..s.e];
                    let dot: f64 = qi.iter().zip(kj).map(|(x, y)| x * y).sum();
                    let added = s.mask_offset(b, i, j).map_or(0.0, |o| match &self.mask {
                        Some(m) if m.dtype == DType::Bool && mask[o] != 0.0 => f64::NEG_INFINITY,
                        Some(m) if m.dtype == DType::Bool => 0.0,
                        _ => mask[o],
                    });
                    *score = if self.causal && j > i {
                        f64::NEG_INFINITY
                    } else {
                        dot * scale + added
                    };
                }
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                // Dropout scales the normalized probabilities: `total` counts every key.
                let kept: Vec<f64> = (0..s.s)
                    .map(|j| match &self.dropout {
                        Some(d) => {
                            let pos = ((b * s.l + i) * s.s + j) as u64;
                            if d.keeps(key, pos) {
                                weights[j] * d.scale.to_f64()
                            } else {
                                0.0
                            }
                        }
                        None => weights[j],
                    })
                    .collect();
                let at = rows.row(3, b, group, i);
                for c in 0..s.ev {
                    let sum: f64 = (0..s.s)
                        .map(|j| kept[j] * v[rows.row(2, b, group, j) + c])
                        .sum();
                    out[at + c] = sum / total;
                }
            }
        }
        out
    }

    /// Floating-point operations of one launch (`4·batch·l·s·e` for the two products,
    /// about half of it when causal).
    pub fn flops(&self, dims: &Bindings) -> Result<f64, EvalError> {
        let s = self.sizes(dims)?;
        let full = 2.0 * s.batch as f64 * s.l as f64 * s.s as f64 * (s.e + s.ev) as f64;
        Ok(if self.causal { full / 2.0 } else { full })
    }
}

impl fmt::Display for Attention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "attention {} [{}] q {}×{} k {}×{} v {}×{} scale {} (batch strides {}, {}, {})",
            self.dtype,
            self.batch,
            self.l,
            self.e,
            self.s,
            self.e,
            self.s,
            self.ev,
            self.scale.to_f64(),
            self.q_batch_stride,
            self.k_batch_stride,
            self.v_batch_stride
        )?;
        if self.kv_group != Dim::constant(1) {
            write!(f, " kv group {}", self.kv_group)?;
        }
        if let Some(l) = &self.layout {
            let row = |s: &[Dim; 4]| format!("{} + {}, {}, {}", s[0], s[1], s[2], s[3]);
            write!(
                f,
                " in place (heads {}; q {}; k {}; v {}; out {})",
                l.heads,
                row(&l.q),
                row(&l.k),
                row(&l.v),
                row(&l.out)
            )?;
        }
        if self.causal {
            f.write_str(" causal")?;
        }
        if let Some(m) = &self.mask {
            let [o, h, i, j] = &m.strides;
            write!(
                f,
                " + mask {} (heads {}, strides {o}, {h}, {i}, {j})",
                m.dtype, m.heads
            )?;
        }
        if let Some(d) = &self.dropout {
            write!(
                f,
                " dropout (keep ≥ {}, × {})",
                d.threshold,
                d.scale.to_f64()
            )?;
        }
        Ok(())
    }
}

/// One piece of the backward pass of an [`Attention`] (`forward`), computed as flash
/// attention does: the probabilities are recomputed from the scores and each query's
/// log-sum-exp, so no `[l, s]` matrix is stored.
///
/// With `p_ij = exp(score_ij − lse_i)` (0 where the key is hidden), `f_ij` the dropout
/// factor (1 without dropout), `dO` the output's gradient and `delta_i = dO_i · out_i`:
///
/// - [`LogSumExp`](AttentionPart::LogSumExp): `lse_i = log Σ_j exp(score_ij)` in `f32`,
///   `batch·l` elements; buffers `[q, k, mask?, lse]`.
/// - [`Query`](AttentionPart::Query): `dq_i = scale Σ_j ds_ij k_j` with
///   `ds_ij = p_ij (f_ij (dO_i · v_j) − delta_i)`, `batch·l·e` elements.
/// - [`Key`](AttentionPart::Key): `dk_j = scale Σ_i ds_ij q_i` for each pair, stored
///   transposed (`batch` matrices of `e × s`, as the product `qᵀ · ds` that autograd
///   records), or as rows (`s × e`) with [`key_rows`](AttentionBackward::key_rows): with
///   grouped-query heads, one matrix per query head (the caller sums a group's).
/// - [`Value`](AttentionPart::Value): `dv_j = Σ_i p_ij f_ij dO_i` for each pair,
///   `batch·s·ev` elements.
///
/// - [`Gradients`](AttentionPart::Gradients): `dq`, `dkᵀ` and `dv` at once, as above (one
///   pass over the `(query, key)` pairs instead of three).
/// - [`OutputAndLogSumExp`](AttentionPart::OutputAndLogSumExp): the forward's output and
///   `lse` at once (the forward saving what the backward reads, as flash attention's
///   forward does); buffers `[q, k, v, mask?, key?, out, lse]`, as the forward binds them
///   with `lse` after.
///
/// The gradients bind as `[q, k, v, mask?, key?, dO, lse, delta, out]` (`out` being `dq`,
/// `dkᵀ`, `dv` for [`Gradients`](AttentionPart::Gradients)): `dO` contiguous `batch·l·ev` in
/// `dtype`, `lse` and `delta` contiguous `batch·l` in `f32`, the results in `dtype`.
/// Everything is computed in `f32`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttentionBackward {
    /// The attention differentiated.
    pub forward: Attention,
    /// What this piece computes.
    pub part: AttentionPart,
    /// For [`Key`](AttentionPart::Key) and [`Gradients`](AttentionPart::Gradients): `dk`
    /// stored as rows (`batch·s·e`, `k`'s own layout, as the product `dsᵀ · q` writes it)
    /// instead of transposed. False for the other parts.
    pub key_rows: bool,
}

/// What an [`AttentionBackward`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionPart {
    /// Each query's log-sum-exp of its scores.
    LogSumExp,
    /// The gradient of `q`.
    Query,
    /// The gradient of `k`, per query pair.
    Key,
    /// The gradient of `v`, per query pair.
    Value,
    /// The gradients of `q`, `k` and `v` in one program.
    Gradients,
    /// The forward's output and each query's log-sum-exp in one program.
    OutputAndLogSumExp,
}

impl AttentionPart {
    /// Every part, in declaration order.
    pub const ALL: [AttentionPart; 6] = [
        AttentionPart::LogSumExp,
        AttentionPart::Query,
        AttentionPart::Key,
        AttentionPart::Value,
        AttentionPart::Gradients,
        AttentionPart::OutputAndLogSumExp,
    ];

    /// The values [`AttentionBackward::key_rows`] can take for this part: both layouts
    /// for the parts that write the key gradient, `false` alone for the rest.
    pub fn key_layouts(self) -> &'static [bool] {
        match self {
            AttentionPart::Key | AttentionPart::Gradients => &[false, true],
            _ => &[false],
        }
    }
}

/// [`AttentionBackward::reference`]'s results, every one in `f64`.
#[derive(Clone, Debug, Default)]
pub struct AttentionGrads {
    /// The forward's output, `batch·l·ev`.
    pub out: Vec<f64>,
    /// `batch·l`.
    pub lse: Vec<f64>,
    /// `dO_i · out_i`, `batch·l`.
    pub delta: Vec<f64>,
    /// `batch·l·e`.
    pub dq: Vec<f64>,
    /// Per query pair, transposed: element `(b, d, j)` at `(b·e + d)·s + j`
    /// ([`AttentionGrads::dk_rows`] gives rows).
    pub dk: Vec<f64>,
    /// Per query pair, `batch·s·ev`.
    pub dv: Vec<f64>,
}

impl AttentionGrads {
    /// `dk` as rows: element `(b, j, d)` at `(b·s + j)·e + d`, for `s` keys of `e`.
    pub fn dk_rows(&self, s: usize, e: usize) -> Vec<f64> {
        let batch = self.dk.len() / (s * e).max(1);
        let mut rows = vec![0.0; self.dk.len()];
        for b in 0..batch {
            for d in 0..e {
                for j in 0..s {
                    rows[(b * s + j) * e + d] = self.dk[(b * e + d) * s + j];
                }
            }
        }
        rows
    }
}

impl AttentionBackward {
    /// Every piece in `f64` from operands read as `f64` (the definition every program is
    /// tested against); `d_out` is `batch·l·ev`, the rest as for [`Attention::reference`].
    pub fn reference(
        forward: &Attention,
        s: &AttentionSizes,
        [q, k, v, mask, d_out]: [&[f64]; 5],
        key: [u32; 4],
    ) -> AttentionGrads {
        debug_assert!(
            forward.layout.is_none(),
            "the backward reads the batch strides"
        );
        let scale = forward.scale.to_f64();
        let [qs, ks, vs] = s.batch_strides;
        let mut r = AttentionGrads {
            dk: vec![0.0; s.batch * s.s * s.e],
            dv: vec![0.0; s.batch * s.s * s.ev],
            ..AttentionGrads::default()
        };
        let out = forward.reference(s, [q, k, v, mask], key);
        for b in 0..s.batch {
            let g = b / s.kv_group;
            for i in 0..s.l {
                let qi = &q[b * qs + i * s.e..][..s.e];
                let row = (b * s.l + i) * s.ev;
                let (d_oi, oi) = (&d_out[row..][..s.ev], &out[row..][..s.ev]);
                let scores: Vec<f64> = (0..s.s)
                    .map(|j| {
                        let kj = &k[g * ks + j * s.e..][..s.e];
                        let dot: f64 = qi.iter().zip(kj).map(|(x, y)| x * y).sum();
                        let added = s.mask_offset(b, i, j).map_or(0.0, |o| match &forward.mask {
                            Some(m) if m.dtype == DType::Bool && mask[o] != 0.0 => {
                                f64::NEG_INFINITY
                            }
                            Some(m) if m.dtype == DType::Bool => 0.0,
                            _ => mask[o],
                        });
                        if forward.causal && j > i {
                            f64::NEG_INFINITY
                        } else {
                            dot * scale + added
                        }
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + scores.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
                let delta: f64 = d_oi.iter().zip(oi).map(|(x, y)| x * y).sum();
                r.lse.push(lse);
                r.delta.push(delta);
                let mut dq = vec![0.0; s.e];
                for (j, score) in scores.iter().enumerate() {
                    let p = (score - lse).exp();
                    let factor = match &forward.dropout {
                        Some(d) if d.keeps(key, ((b * s.l + i) * s.s + j) as u64) => {
                            d.scale.to_f64()
                        }
                        Some(_) => 0.0,
                        None => 1.0,
                    };
                    let vj = &v[g * vs + j * s.ev..][..s.ev];
                    let dp: f64 = d_oi.iter().zip(vj).map(|(x, y)| x * y).sum();
                    let ds = p * (factor * dp - delta);
                    let kj = &k[g * ks + j * s.e..][..s.e];
                    for d in 0..s.e {
                        dq[d] += scale * ds * kj[d];
                        r.dk[(b * s.e + d) * s.s + j] += scale * ds * qi[d];
                    }
                    let dv = &mut r.dv[(b * s.s + j) * s.ev..][..s.ev];
                    for (x, dv) in dv.iter_mut().enumerate() {
                        *dv += p * factor * d_oi[x];
                    }
                }
                r.dq.extend(dq);
            }
        }
        r.out = out;
        r
    }

    /// Elements of each result for one launch's sizes, in binding order.
    pub fn out_elements(&self, s: &AttentionSizes) -> Vec<usize> {
        let [dq, dk, dv] = [
            s.batch * s.l * s.e,
            s.batch * s.s * s.e,
            s.batch * s.s * s.ev,
        ];
        match self.part {
            AttentionPart::LogSumExp => vec![s.batch * s.l],
            AttentionPart::Query => vec![dq],
            AttentionPart::Key => vec![dk],
            AttentionPart::Value => vec![dv],
            AttentionPart::Gradients => vec![dq, dk, dv],
            AttentionPart::OutputAndLogSumExp => vec![s.batch * s.l * s.ev, s.batch * s.l],
        }
    }
}

impl fmt::Display for AttentionBackward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let part = match self.part {
            AttentionPart::LogSumExp => "log-sum-exp",
            AttentionPart::Query => "dq",
            AttentionPart::Key if self.key_rows => "dk (rows)",
            AttentionPart::Key => "dk",
            AttentionPart::Value => "dv",
            AttentionPart::Gradients if self.key_rows => "dq, dk (rows) and dv",
            AttentionPart::Gradients => "dq, dk and dv",
            AttentionPart::OutputAndLogSumExp => "output and log-sum-exp",
        };
        write!(f, "{part} of {}", self.forward)
    }
}

#[cfg(test)]
mod tests {
    use tessel_shape::{Bindings, DType, Dim, Scalar};

    use super::{Attention, AttentionLayout};

    fn op(batch: i64, [l, s, e]: [i64; 3], strides: [i64; 3], group: i64) -> Attention {
        Attention {
            dtype: DType::F32,
            batch: batch.into(),
            l: l.into(),
            s: s.into(),
            e: e.into(),
            ev: e.into(),
            q_batch_stride: strides[0].into(),
            k_batch_stride: strides[1].into(),
            v_batch_stride: strides[2].into(),
            kv_group: group.into(),
            scale: Scalar::F32(1.0),
            causal: false,
            mask: None,
            dropout: None,
            layout: None,
        }
    }

    /// The batch strides' layout places every row where the batch strides say: `q` of pair
    /// `b` at `b·q_stride`, `k` and `v` of its group `b / kv_group`, the output contiguous.
    #[test]
    fn the_batch_strides_layout_places_rows_as_the_strides_do() {
        let (l, s, e) = (5usize, 7usize, 4usize);
        for (batch, strides, group) in [
            (6, [l * e, s * e, s * e], 1),
            (6, [l * e, s * e, s * e], 3),
            (4, [l * e + 8, 0, s * e], 2),
        ] {
            let op = op(
                batch as i64,
                [l, s, e].map(|x| x as i64),
                strides.map(|x| x as i64),
                group as i64,
            );
            let sizes = op.sizes(&Bindings::new()).unwrap();
            for b in 0..batch {
                for i in 0..l.min(s) {
                    let g = b / group;
                    assert_eq!(sizes.rows.row(0, b, group, i), b * strides[0] + i * e);
                    assert_eq!(sizes.rows.row(1, b, group, i), g * strides[1] + i * e);
                    assert_eq!(sizes.rows.row(2, b, group, i), g * strides[2] + i * e);
                    assert_eq!(sizes.rows.row(3, b, group, i), (b * l + i) * e);
                }
            }
            let last = batch - 1;
            assert_eq!(
                sizes.min_elements(),
                [
                    last * strides[0] + l * e,
                    (last / group) * strides[1] + s * e,
                    (last / group) * strides[2] + s * e,
                    batch * l * e,
                ]
            );
        }
    }

    /// With a layout, buffers must reach the farthest row any pair reads or writes, also
    /// when the pairs do not fill the last outer index's heads.
    #[test]
    fn rows_in_place_need_the_farthest_row() {
        let d = |v: usize| Dim::constant(v as i64);
        let (l, e, heads) = (3usize, 4usize, 3usize);
        let mut op = op(5, [3, 3, 4], [0, 0, 0], 1);
        let row = 3 * heads * e;
        op.layout = Some(Box::new(AttentionLayout {
            heads: d(heads),
            q: [d(0), d(l * row), d(e), d(row)],
            k: [d(heads * e), d(l * row), d(e), d(row)],
            v: [d(2 * heads * e), d(l * row), d(e), d(row)],
            out: [d(0), d(l * heads * e), d(e), d(heads * e)],
        }));
        let sizes = op.sizes(&Bindings::new()).unwrap();
        // Pairs 0..5 are (outer, head) (0, 0..3) and (1, 0..2): the farthest `q` row is
        // pair 2's (outer 0, head 2) or pair 4's (outer 1, head 1), row 2.
        let far = |offset: usize| {
            [(0, 2), (1, 1)]
                .map(|(o, h)| offset + o * l * row + h * e + (l - 1) * row + e)
                .into_iter()
                .max()
                .unwrap()
        };
        let out_far = [(0, 2), (1, 1)]
            .map(|(o, h)| o * l * heads * e + h * e + (l - 1) * heads * e + e)
            .into_iter()
            .max()
            .unwrap();
        assert_eq!(
            sizes.min_elements(),
            [far(0), far(heads * e), far(2 * heads * e), out_far]
        );
        for p in 0..5 {
            assert_eq!(
                sizes.rows.row(1, p, 1, 2),
                heads * e + (p / heads) * l * row + (p % heads) * e + 2 * row
            );
        }
    }
}
