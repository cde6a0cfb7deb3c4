//! Contractions: `einsum`, `tensordot`, `outer`, `bmm`, `baddbmm` and `cross`, lowered to
//! movement ops, `sum` and `matmul` so the vendor matmul path and fusion apply.
//!
//! `einsum` contracts operands pairwise, left to right: each pair becomes one batched
//! `[batch, m, k] · [batch, k, n]` matmul after labels only one side needs are summed out.
//! A label repeated within one operand (`ii`, a diagonal) is taken with a strided slice
//! of the flattened pair of dims, which is exact and costs no extra memory.

use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};
use tessel_shape::{DType, rules};

const EINSUM: &str = "einsum";
/// Labels of ellipsis dims: `ELLIPSIS + k` for the `k`-th broadcast dim it covers.
const ELLIPSIS: u32 = 1000;

/// A tensor whose dims are named by distinct labels.
struct Labeled {
    t: Tensor,
    labels: Vec<u32>,
}

fn invalid(op: &'static str, reason: String) -> Error {
    Error::InvalidArgument { op, reason }
}

/// One parsed term: letters as their code points, `None` for the ellipsis.
fn parse_term(term: &str, offset: usize, equation: &str) -> Result<Vec<Option<u32>>> {
    let mut out = Vec::new();
    let bytes = term.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() {
            out.push(Some(u32::from(c)));
            i += 1;
        } else if term[i..].starts_with("...") {
            if out.contains(&None) {
                return Err(invalid(
                    EINSUM,
                    format!(
                        "equation {equation:?} has a second '...' at position {}; each term may hold at most one",
                        offset + i
                    ),
                ));
            }
            out.push(None);
            i += 3;
        } else {
            let ch = term[i..].chars().next().unwrap_or('?');
            return Err(invalid(
                EINSUM,
                format!(
                    "equation {equation:?} has invalid character {ch:?} at position {}; subscripts are letters a-z, A-Z and '...'",
                    offset + i
                ),
            ));
        }
    }
    Ok(out)
}

/// The term's labels for an operand of `ndim` dims, with the ellipsis expanded to the
/// last `ndim - letters` of `ell` broadcast dims.
fn expand_term(
    term: &[Option<u32>],
    ndim: usize,
    ell: usize,
    which: usize,
    shape: &[usize],
) -> Result<Vec<u32>> {
    let letters = term.iter().filter(|l| l.is_some()).count();
    let has_ellipsis = term.len() > letters;
    if letters > ndim || (!has_ellipsis && letters != ndim) {
        return Err(invalid(
            EINSUM,
            format!(
                "operand {which} has shape {shape:?} ({ndim} dims) but its subscripts name {letters} dims{}; give one letter per dim",
                if has_ellipsis { " plus '...'" } else { "" }
            ),
        ));
    }
    let covered = ndim - letters;
    let mut out = Vec::with_capacity(ndim);
    for l in term {
        match l {
            Some(c) => out.push(*c),
            None => out.extend((ell - covered..ell).map(|k| ELLIPSIS + k as u32)),
        }
    }
    Ok(out)
}

fn to_i64(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn axes_i64(axes: &[usize]) -> Vec<i64> {
    axes.iter().map(|&a| to_i64(a)).collect()
}

/// `x` with repeated labels reduced to their diagonal, so every label is distinct.
fn take_diagonals(mut t: Tensor, mut labels: Vec<u32>, which: usize) -> Result<Labeled> {
    while let Some((p, q)) = (0..labels.len()).find_map(|p| {
        (p + 1..labels.len())
            .find(|&q| labels[q] == labels[p])
            .map(|q| (p, q))
    }) {
        // Move the pair last, flatten it, and step by n + 1 to walk the diagonal.
        let n = t.dims()[p];
        if t.dims()[q] != n {
            let ch = char::from_u32(labels[p]).unwrap_or('?');
            return Err(invalid(
                EINSUM,
                format!(
                    "operand {which} of shape {:?} repeats subscript {ch:?} on dims {p} and {q} of sizes {n} and {}; a repeated subscript takes a diagonal, so the sizes must match",
                    t.dims(),
                    t.dims()[q]
                ),
            ));
        }
        let mut order: Vec<usize> = (0..labels.len()).filter(|&a| a != p && a != q).collect();
        order.extend([p, q]);
        let mut dims: Vec<i64> = order[..order.len() - 2]
            .iter()
            .map(|&a| to_i64(t.dims()[a]))
            .collect();
        dims.push(to_i64(n * n));
        t = t.permute(&axes_i64(&order))?.reshape(&dims)?;
        t = t.slice(-1, None, None, to_i64(n + 1))?;
        let mut new_labels: Vec<u32> = order[..order.len() - 2]
            .iter()
            .map(|&a| labels[a])
            .collect();
        new_labels.push(labels[p]);
        labels = new_labels;
    }
    Ok(Labeled { t, labels })
}

/// Sums out the labels of `x` not in `keep`; `x` keeps its dtype.
fn sum_out(x: Labeled, keep: &[u32]) -> Result<Labeled> {
    let axes: Vec<usize> = (0..x.labels.len())
        .filter(|&a| !keep.contains(&x.labels[a]))
        .collect();
    if axes.is_empty() {
        return Ok(x);
    }
    let dtype = x.t.dtype();
    let t = x.t.sum(&axes_i64(&axes), false)?.cast(dtype);
    let labels = x
        .labels
        .iter()
        .copied()
        .filter(|l| keep.contains(l))
        .collect();
    Ok(Labeled { t, labels })
}

/// The size of `label` in `x` (1 when absent).
fn size_of(x: &Labeled, label: u32) -> usize {
    x.labels
        .iter()
        .position(|&l| l == label)
        .map_or(1, |a| x.t.dims()[a])
}

/// `x` permuted to `order` (labels it holds) and reshaped to the products of `groups`.
fn grouped(x: &Labeled, order: &[u32], groups: &[usize]) -> Result<Tensor> {
    let axes: Vec<i64> = order
        .iter()
        .map(|l| to_i64(x.labels.iter().position(|m| m == l).unwrap_or(0)))
        .collect();
    let mut dims = Vec::with_capacity(groups.len());
    let mut start = 0;
    for &g in groups {
        let n: usize = order[start..start + g]
            .iter()
            .map(|&l| size_of(x, l))
            .product();
        dims.push(to_i64(n));
        start += g;
    }
    x.t.permute(&axes)?.reshape(&dims)
}

/// Contracts `a` and `b` (distinct labels each, sizes already agreeing) keeping the
/// labels in `keep`, as one batched matmul.
fn contract(a: Labeled, b: Labeled, keep: &[u32]) -> Result<Labeled> {
    let mut keep_a: Vec<u32> = keep.to_vec();
    keep_a.extend(b.labels.iter().copied());
    let mut keep_b: Vec<u32> = keep.to_vec();
    keep_b.extend(a.labels.iter().copied());
    let (a, b) = (sum_out(a, &keep_a)?, sum_out(b, &keep_b)?);
    let in_b = |l: &u32| b.labels.contains(l);
    let in_a = |l: &u32| a.labels.contains(l);
    let batch: Vec<u32> = a
        .labels
        .iter()
        .copied()
        .filter(|l| in_b(l) && keep.contains(l))
        .collect();
    let inner: Vec<u32> = a
        .labels
        .iter()
        .copied()
        .filter(|l| in_b(l) && !keep.contains(l))
        .collect();
    let left: Vec<u32> = a.labels.iter().copied().filter(|l| !in_b(l)).collect();
    let right: Vec<u32> = b.labels.iter().copied().filter(|l| !in_a(l)).collect();
    let order_a: Vec<u32> = [&batch[..], &left, &inner].concat();
    let order_b: Vec<u32> = [&batch[..], &inner, &right].concat();
    let ga = grouped(&a, &order_a, &[batch.len(), left.len(), inner.len()])?;
    let gb = grouped(&b, &order_b, &[batch.len(), inner.len(), right.len()])?;
    let dtype = a.t.dtype();
    let product = ga.matmul(&gb)?.cast(dtype);
    let labels: Vec<u32> = [&batch[..], &left, &right].concat();
    let dims: Vec<i64> = batch
        .iter()
        .map(|&l| size_of(&a, l))
        .chain(left.iter().map(|&l| size_of(&a, l)))
        .chain(right.iter().map(|&l| size_of(&b, l)))
        .map(to_i64)
        .collect();
    Ok(Labeled {
        t: product.reshape(&dims)?,
        labels,
    })
}

impl Tensor {
    /// Einstein summation (`torch.einsum`): `equation` names each operand's dims with
    /// letters, optionally `...` for broadcast dims, and the output after `->` (or, without
    /// `->`, the labels used once, alphabetically, after the ellipsis dims). Labels not in
    /// the output are summed; a label repeated in one operand takes its diagonal; dims of
    /// size 1 broadcast. Operands promote to a common dtype (`bool` is rejected).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from([[1.0f32, 2.0], [3.0, 4.0]]);
    /// let b = Tensor::from([[5.0f32, 6.0], [7.0, 8.0]]);
    /// let c = Tensor::einsum("ij,jk->ik", &[&a, &b])?;
    /// assert_eq!(c.to_vec::<f32>()?, vec![19.0, 22.0, 43.0, 50.0]);
    /// assert_eq!(Tensor::einsum("ii", &[&a])?.item::<f32>()?, 5.0); // the trace
    /// assert!(Tensor::einsum("ij,jk->iz", &[&a, &b]).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
        let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (eq.as_str(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        if terms.len() != operands.len() {
            return Err(invalid(
                EINSUM,
                format!(
                    "equation {equation:?} has {} operand terms but {} operands were given; give one comma-separated term per operand",
                    terms.len(),
                    operands.len()
                ),
            ));
        }
        let Some(first) = operands.first() else {
            return Err(invalid(EINSUM, "at least one operand is required".into()));
        };
        let mut dtype = first.dtype();
        for t in &operands[1..] {
            first.same_device(t, EINSUM)?;
            dtype = dtype
                .promote(t.dtype())
                .map_err(|source| Error::Promotion { op: EINSUM, source })?;
        }
        if dtype == DType::Bool {
            return Err(Error::UnsupportedDType {
                op: EINSUM,
                dtype,
                hint: "cast to a number type first, e.g. .cast(DType::F32)",
            });
        }
        let mut offset = 0;
        let mut parsed = Vec::with_capacity(terms.len());
        for term in &terms {
            parsed.push(parse_term(term, offset, &eq)?);
            offset += term.len() + 1;
        }
        // Ellipsis dims right-align across operands, like broadcasting.
        let letters = |p: &[Option<u32>]| p.iter().filter(|l| l.is_some()).count();
        let ell = parsed
            .iter()
            .zip(operands)
            .filter(|(p, _)| p.contains(&None))
            .map(|(p, t)| t.ndim().saturating_sub(letters(p)))
            .max()
            .unwrap_or(0);
        let mut labeled = Vec::with_capacity(operands.len());
        for (k, (p, t)) in parsed.iter().zip(operands).enumerate() {
            let labels = expand_term(p, t.ndim(), ell, k, &t.dims())?;
            labeled.push(take_diagonals(t.cast(dtype), labels, k)?);
        }
        let output = output_labels(rhs, &parsed, ell, &eq, lhs.len())?;
        broadcast_sizes(&mut labeled, equation)?;
        let mut rest = labeled.into_iter();
        let mut acc = rest
            .next()
            .ok_or_else(|| Error::Internal("einsum: no operand".into()))?;
        let remaining: Vec<Labeled> = rest.collect();
        for (i, next) in remaining.iter().enumerate() {
            let mut keep = output.clone();
            for later in &remaining[i + 1..] {
                keep.extend(later.labels.iter().copied());
            }
            let next = Labeled {
                t: next.t.clone(),
                labels: next.labels.clone(),
            };
            acc = contract(acc, next, &keep)?;
        }
        let acc = sum_out(acc, &output)?;
        let axes: Vec<i64> = output
            .iter()
            .map(|l| to_i64(acc.labels.iter().position(|m| m == l).unwrap_or(0)))
            .collect();
        acc.t.permute(&axes)
    }
}

/// The output labels: the explicit `rhs`, or the implicit ellipsis dims then the labels
/// used exactly once, in alphabetical (code point) order.
fn output_labels(
    rhs: Option<&str>,
    parsed: &[Vec<Option<u32>>],
    ell: usize,
    eq: &str,
    rhs_offset: usize,
) -> Result<Vec<u32>> {
    let ellipsis: Vec<u32> = (0..ell).map(|k| ELLIPSIS + k as u32).collect();
    let used: Vec<u32> = parsed.iter().flatten().filter_map(|l| *l).collect();
    let Some(rhs) = rhs else {
        let mut once: Vec<u32> = used
            .iter()
            .copied()
            .filter(|l| used.iter().filter(|m| *m == l).count() == 1)
            .collect();
        once.sort_unstable();
        return Ok([ellipsis, once].concat());
    };
    let term = parse_term(rhs, rhs_offset + 2, eq)?;
    let mut out = Vec::new();
    for (i, l) in term.iter().enumerate() {
        match l {
            None => out.extend(ellipsis.iter().copied()),
            Some(c) => {
                let ch = char::from_u32(*c).unwrap_or('?');
                if !used.contains(c) {
                    return Err(invalid(
                        EINSUM,
                        format!(
                            "equation {eq:?}: output subscript {ch:?} (output position {i}) does not appear in any operand; use only input letters after '->'"
                        ),
                    ));
                }
                if term[..i].contains(l) {
                    return Err(invalid(
                        EINSUM,
                        format!(
                            "equation {eq:?}: output subscript {ch:?} appears more than once; each output letter must be distinct"
                        ),
                    ));
                }
                out.push(*c);
            }
        }
    }
    Ok(out)
}

/// Checks every label has one size across operands (size 1 broadcasts) and expands the
/// size-1 dims, so contractions see agreeing sizes.
fn broadcast_sizes(operands: &mut [Labeled], equation: &str) -> Result<()> {
    let mut sizes: Vec<(u32, usize, usize)> = Vec::new();
    for (k, x) in operands.iter().enumerate() {
        for (&l, &n) in x.labels.iter().zip(&x.t.dims()) {
            match sizes.iter_mut().find(|(m, _, _)| *m == l) {
                Some((_, size, first)) => {
                    if *size == 1 {
                        *size = n;
                        *first = k;
                    } else if n != 1 && n != *size {
                        let name = if l >= ELLIPSIS {
                            "'...'".to_owned()
                        } else {
                            format!("{:?}", char::from_u32(l).unwrap_or('?'))
                        };
                        return Err(invalid(
                            EINSUM,
                            format!(
                                "equation {equation:?}: subscript {name} has size {size} in operand {first} but {n} in operand {k}; sizes must match or be 1"
                            ),
                        ));
                    }
                }
                None => sizes.push((l, n, k)),
            }
        }
    }
    for x in operands.iter_mut() {
        let target: Vec<i64> = x
            .labels
            .iter()
            .map(|l| to_i64(sizes.iter().find(|(m, _, _)| m == l).map_or(1, |s| s.1)))
            .collect();
        if x.t
            .dims()
            .iter()
            .map(|&d| to_i64(d))
            .ne(target.iter().copied())
        {
            x.t = x.t.expand(&target)?;
        }
    }
    Ok(())
}

/// The number-type dtype two operands of `op` promote to (`bool` rejected).
fn numeric_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<DType> {
    a.same_device(b, op)?;
    let dtype = a
        .dtype()
        .promote(b.dtype())
        .map_err(|source| Error::Promotion { op, source })?;
    if dtype == DType::Bool {
        return Err(Error::UnsupportedDType {
            op,
            dtype,
            hint: "cast to a number type first, e.g. .cast(DType::F32)",
        });
    }
    Ok(dtype)
}

impl Tensor {
    /// Contracts the last `dims` dims of `self` with the first `dims` of `other`
    /// (`torch.tensordot(a, b, dims=n)`); the result has `self`'s other dims then
    /// `other`'s.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::ones([2, 3, 4], tessel_tensor::DType::F32);
    /// let b = Tensor::ones([3, 4, 5], tessel_tensor::DType::F32);
    /// let c = a.tensordot(&b, 2)?;
    /// assert_eq!(c.dims(), vec![2, 5]);
    /// assert_eq!(c.to_vec::<f32>()?[0], 12.0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tensordot(&self, other: &Tensor, dims: usize) -> Result<Tensor> {
        if dims > self.ndim() || dims > other.ndim() {
            return Err(invalid(
                "tensordot",
                format!(
                    "cannot contract {dims} dims of shapes {:?} and {:?}; dims must be at most the smaller rank",
                    self.dims(),
                    other.dims()
                ),
            ));
        }
        let mine: Vec<i64> = (self.ndim() - dims..self.ndim()).map(to_i64).collect();
        let theirs: Vec<i64> = (0..dims).map(to_i64).collect();
        self.tensordot_dims(other, &mine, &theirs)
    }

    /// Contracts dims `dims_self[i]` of `self` with `dims_other[i]` of `other`
    /// (`torch.tensordot(a, b, dims=(dims_self, dims_other))`); negative dims count from
    /// the end. Paired dims must have equal sizes.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from([[1.0f32, 2.0], [3.0, 4.0]]);
    /// let c = a.tensordot_dims(&a, &[0], &[0])?; // a^T a
    /// assert_eq!(c.to_vec::<f32>()?, vec![10.0, 14.0, 14.0, 20.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tensordot_dims(
        &self,
        other: &Tensor,
        dims_self: &[i64],
        dims_other: &[i64],
    ) -> Result<Tensor> {
        const OP: &str = "tensordot";
        let dtype = numeric_dtype(OP, self, other)?;
        if dims_self.len() != dims_other.len() {
            return Err(invalid(
                OP,
                format!(
                    "got {} dims for the first operand but {} for the second; pair every contracted dim",
                    dims_self.len(),
                    dims_other.len()
                ),
            ));
        }
        let (da, db) = (self.dims(), other.dims());
        // Labels: 2000 + i for self's dims, 3000 + j for other's; paired dims share one.
        let la: Vec<u32> = (0..da.len()).map(|i| 2000 + i as u32).collect();
        let mut lb: Vec<u32> = (0..db.len()).map(|j| 3000 + j as u32).collect();
        let mut seen_a = Vec::new();
        let mut seen_b = Vec::new();
        for (&x, &y) in dims_self.iter().zip(dims_other) {
            let i = rules::normalize_axis(OP, x, self.shape())?;
            let j = rules::normalize_axis(OP, y, other.shape())?;
            if seen_a.contains(&i) || seen_b.contains(&j) {
                return Err(invalid(
                    OP,
                    format!(
                        "dims {dims_self:?} and {dims_other:?} repeat a dim; each dim may be contracted once"
                    ),
                ));
            }
            if da[i] != db[j] {
                return Err(invalid(
                    OP,
                    format!(
                        "dim {x} of shape {da:?} has size {} but dim {y} of shape {db:?} has size {}; contracted dims must have equal sizes",
                        da[i], db[j]
                    ),
                ));
            }
            seen_a.push(i);
            seen_b.push(j);
            lb[j] = la[i];
        }
        let keep: Vec<u32> = la
            .iter()
            .enumerate()
            .filter(|(i, _)| !seen_a.contains(i))
            .map(|(_, &l)| l)
            .chain(
                lb.iter()
                    .enumerate()
                    .filter(|(j, _)| !seen_b.contains(j))
                    .map(|(_, &l)| l),
            )
            .collect();
        let a = Labeled {
            t: self.cast(dtype),
            labels: la,
        };
        let b = Labeled {
            t: other.cast(dtype),
            labels: lb,
        };
        Ok(contract(a, b, &keep)?.t)
    }

    /// The outer product of two 1-d tensors (`torch.outer`): `[n] x [m] -> [n, m]`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let o = Tensor::from([1.0f32, 2.0]).outer(&Tensor::from([3.0f32, 4.0, 5.0]))?;
    /// assert_eq!(o.to_vec::<f32>()?, vec![3.0, 4.0, 5.0, 6.0, 8.0, 10.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn outer(&self, other: &Tensor) -> Result<Tensor> {
        if self.ndim() != 1 || other.ndim() != 1 {
            return Err(invalid(
                "outer",
                format!(
                    "expects two 1-d tensors, got shapes {:?} and {:?}; flatten them first with .flatten()",
                    self.dims(),
                    other.dims()
                ),
            ));
        }
        self.unsqueeze(1)?.mul(other.unsqueeze(0)?)
    }

    /// Batched matrix product of two 3-d tensors (`torch.bmm`):
    /// `[b, n, m] x [b, m, p] -> [b, n, p]`, without broadcasting.
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::ones([4, 2, 3], DType::F32);
    /// let b = Tensor::ones([4, 3, 5], DType::F32);
    /// assert_eq!(a.bmm(&b)?.dims(), vec![4, 2, 5]);
    /// assert!(a.bmm(&a).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn bmm(&self, other: &Tensor) -> Result<Tensor> {
        const OP: &str = "bmm";
        let (a, b) = (self.dims(), other.dims());
        if a.len() != 3 || b.len() != 3 {
            return Err(invalid(
                OP,
                format!(
                    "expects two 3-d tensors [b, n, m] and [b, m, p], got shapes {a:?} and {b:?}; use matmul to broadcast"
                ),
            ));
        }
        if a[0] != b[0] || a[2] != b[1] {
            return Err(invalid(
                OP,
                format!(
                    "shapes {a:?} and {b:?} don't fit [b, n, m] x [b, m, p]; batch sizes must be equal and the first's last dim must equal the second's middle dim"
                ),
            ));
        }
        self.matmul(other)
    }

    /// `beta * self + alpha * bmm(batch1, batch2)` (`torch.baddbmm`); `self` broadcasts to
    /// the product's shape, and with `beta == 0` it is ignored (NaN in it doesn't spread).
    ///
    /// ```
    /// # use tessel_tensor::{DType, Tensor};
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let c = Tensor::ones([2, 2, 2], DType::F32);
    /// let r = c.baddbmm(&c, &c, 0.5, 2.0)?;
    /// assert_eq!(r.to_vec::<f32>()?, vec![4.5; 8]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn baddbmm(
        &self,
        batch1: &Tensor,
        batch2: &Tensor,
        beta: f64,
        alpha: f64,
    ) -> Result<Tensor> {
        const OP: &str = "baddbmm";
        let product = batch1.bmm(batch2)?;
        let target = product.dims();
        let fits = self.ndim() <= 3
            && self
                .dims()
                .iter()
                .rev()
                .zip(target.iter().rev())
                .all(|(&s, &t)| s == t || s == 1);
        if !fits {
            return Err(invalid(
                OP,
                format!(
                    "input of shape {:?} doesn't broadcast to the product's shape {target:?}; give a tensor broadcastable to [b, n, p]",
                    self.dims()
                ),
            ));
        }
        let scaled = if (alpha - 1.0).abs() > 0.0 {
            product.mul(alpha)?
        } else {
            product
        };
        if beta == 0.0 {
            let dtype = self
                .dtype()
                .promote(scaled.dtype())
                .map_err(|source| Error::Promotion { op: OP, source })?;
            return Ok(scaled.cast(dtype));
        }
        let base = if (beta - 1.0).abs() > 0.0 {
            self.mul(beta)?
        } else {
            self.clone()
        };
        base.add(&scaled)
    }

    /// The cross product of 3-vectors along `dim` (`torch.linalg.cross`; PyTorch's default
    /// `dim` is -1), broadcasting the other dims. `dim` must have size 3 in both.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let x = Tensor::from([1.0f32, 0.0, 0.0]);
    /// let y = Tensor::from([0.0f32, 1.0, 0.0]);
    /// assert_eq!(x.cross(&y, -1)?.to_vec::<f32>()?, vec![0.0, 0.0, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cross(&self, other: &Tensor, dim: i64) -> Result<Tensor> {
        const OP: &str = "cross";
        numeric_dtype(OP, self, other)?;
        let (a, b) = self.align(other, OP)?;
        let d = rules::normalize_axis(OP, dim, a.shape())?;
        if self.ndim() + d < a.ndim()
            || self.dims()[d + self.ndim() - a.ndim()] != 3
            || other.ndim() + d < a.ndim()
            || other.dims()[d + other.ndim() - a.ndim()] != 3
        {
            return Err(invalid(
                OP,
                format!(
                    "dim {dim} must have size 3 in both inputs, got shapes {:?} and {:?}; pick the dim holding the 3-vectors",
                    self.dims(),
                    other.dims()
                ),
            ));
        }
        let axis = to_i64(d);
        let at = |t: &Tensor, i: i64| t.narrow(axis, i, 1);
        let (a0, a1, a2) = (at(&a, 0)?, at(&a, 1)?, at(&a, 2)?);
        let (b0, b1, b2) = (at(&b, 0)?, at(&b, 1)?, at(&b, 2)?);
        let c0 = a1.mul(&b2)?.sub(a2.mul(&b1)?)?;
        let c1 = a2.mul(&b0)?.sub(a0.mul(&b2)?)?;
        let c2 = a0.mul(&b1)?.sub(a1.mul(&b0)?)?;
        Tensor::cat(&[&c0, &c1, &c2], axis)
    }
}

impl Tensor {
    /// `self / max(||self||_p, eps)` along `dim` (`torch.nn.functional.normalize`;
    /// PyTorch's defaults are `p = 2`, `dim = 1`, `eps = 1e-12`). `p` may be
    /// `f64::INFINITY` (max norm); it must be positive. Integers compute in `f32`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([[3.0f32, 4.0], [0.0, 0.0]]);
    /// assert_eq!(t.normalize(2.0, 1, 1e-12)?.to_vec::<f32>()?, vec![0.6, 0.8, 0.0, 0.0]);
    /// assert!(t.normalize(0.0, 1, 1e-12).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn normalize(&self, p: f64, dim: i64, eps: f64) -> Result<Tensor> {
        const OP: &str = "normalize";
        if p.is_nan() || p <= 0.0 {
            return Err(invalid(
                OP,
                format!("p must be positive, got {p}; use 2.0 for the Euclidean norm"),
            ));
        }
        // Halves compute in f32: eps (1e-12) would flush to 0 in f16 and make 0 / 0.
        let dtype = self.to_float().dtype();
        let x = self.to_float().cast_to(opmath(dtype));
        rules::normalize_axis(OP, dim, x.shape())?;
        let a = x.abs()?;
        #[allow(clippy::float_cmp)] // exact special values of p select exact formulas
        let norm = if p.is_infinite() {
            a.max(&[dim], true)?
        } else if p == 1.0 {
            a.sum(&[dim], true)?
        } else if p == 2.0 {
            x.mul(&x)?.sum(&[dim], true)?.sqrt()
        } else {
            a.pow(p)?.sum(&[dim], true)?.pow(1.0 / p)?
        };
        Ok(x.div(norm.clamp(Some(eps), None)?)?.cast_to(dtype))
    }

    /// The cosine of the angle between `self` and `other` along `dim`
    /// (`torch.nn.functional.cosine_similarity`): `sum(x1 x2) / sqrt(max(sum(x1^2)
    /// sum(x2^2), eps^2))`, broadcasting the inputs; `dim` is removed. PyTorch's defaults
    /// are `dim = 1`, `eps = 1e-8`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from([[1.0f32, 0.0], [1.0, 1.0]]);
    /// let b = Tensor::from([[0.0f32, 2.0], [2.0, 2.0]]);
    /// let c = a.cosine_similarity(&b, 1, 1e-8)?.to_vec::<f32>()?;
    /// assert!(c[0].abs() < 1e-7 && (c[1] - 1.0).abs() < 1e-6);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cosine_similarity(&self, other: &Tensor, dim: i64, eps: f64) -> Result<Tensor> {
        const OP: &str = "cosine_similarity";
        let (a, b) = self.align(other, OP)?;
        let dtype = a.to_float().dtype();
        // Halves compute in f32: eps^2 would flush to 0 in f16 and make 0 / 0.
        let (a, b) = (
            a.to_float().cast_to(opmath(dtype)),
            b.to_float().cast_to(opmath(dtype)),
        );
        rules::normalize_axis(OP, dim, a.shape())?;
        let dot = a.mul(&b)?.sum(&[dim], false)?;
        let w1 = a.mul(&a)?.sum(&[dim], false)?;
        let w2 = b.mul(&b)?.sum(&[dim], false)?;
        let n = w1.mul(&w2)?.clamp(Some(eps * eps), None)?.sqrt();
        Ok(dot.div(n)?.cast_to(dtype))
    }
}

/// The dtype a float `dtype` computes in: `f32` for `f16`/`bf16`.
fn opmath(dtype: DType) -> DType {
    if matches!(dtype, DType::F16 | DType::BF16) {
        DType::F32
    } else {
        dtype
    }
}
