//! Contractions (`einsum`, `tensordot`, `outer`, `bmm`, `baddbmm`, `cross`) against plain
//! `f64` loops over every label.

use crate::common::{self, Domain, Layout, Rng};
use tessel_tensor::{DType, Error, Result, Tensor};

/// Values in `[-2, 2]`, integers in `[-3, 3]`: products and short sums stay exact for
/// integers and well inside every float format.
const DOMAIN: Domain = Domain::new((-2.0, 2.0), (-3, 3));

/// A random operand of `dtype` and `dims`, with its values.
fn operand(rng: &mut Rng, dtype: DType, dims: &[usize]) -> (Tensor, Vec<f64>) {
    let values = common::random(rng, dtype, dims.iter().product(), DOMAIN);
    (common::tensor(dtype, &values, dims), values)
}

/// The reference einsum for an explicit, letters-only equation: loops over every
/// combination of label values; size-1 dims broadcast.
fn reference(equation: &str, operands: &[(&[f64], &[usize])]) -> (Vec<f64>, Vec<usize>) {
    let (lhs, out) = equation.split_once("->").expect("reference needs '->'");
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    let out: Vec<char> = out.chars().collect();
    let mut labels: Vec<(char, usize)> = Vec::new();
    for (term, (_, dims)) in terms.iter().zip(operands) {
        for (&c, &n) in term.iter().zip(dims.iter()) {
            match labels.iter_mut().find(|(l, _)| *l == c) {
                Some((_, size)) => *size = (*size).max(n),
                None => labels.push((c, n)),
            }
        }
    }
    let size = |c: char| labels.iter().find(|(l, _)| *l == c).map_or(1, |s| s.1);
    let out_dims: Vec<usize> = out.iter().map(|&c| size(c)).collect();
    let total: usize = labels.iter().map(|s| s.1).product();
    let mut result = vec![0.0; out_dims.iter().product()];
    for flat in 0..total {
        // The value of every label at this point of the iteration space.
        let mut rem = flat;
        let mut at = vec![0usize; labels.len()];
        for (k, (_, n)) in labels.iter().enumerate().rev() {
            at[k] = rem % n;
            rem /= n;
        }
        let value = |c: char| at[labels.iter().position(|(l, _)| *l == c).unwrap()];
        let mut prod = 1.0;
        for (term, (values, dims)) in terms.iter().zip(operands) {
            let index = term.iter().zip(dims.iter()).fold(0, |acc, (&c, &n)| {
                acc * n + if n == 1 { 0 } else { value(c) }
            });
            prod *= values[index];
        }
        let o = out
            .iter()
            .zip(&out_dims)
            .fold(0, |acc, (&c, &n)| acc * n + value(c));
        result[o] += prod;
    }
    (result, out_dims)
}

fn rel(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 | DType::BF16 => 1e-2,
        _ => 0.0,
    }
}

/// Checks a result against a reference: dtype, dims, then values with errors absolute
/// below 1 (sums of products cancel).
#[track_caller]
fn check(what: &str, got: &Tensor, dtype: DType, want: &[f64], dims: &[usize]) {
    assert_eq!((got.dtype(), got.dims()), (dtype, dims.to_vec()), "{what}");
    if common::skipped(got, what) {
        return;
    }
    let want: Vec<f64> = want.iter().map(|&w| common::round_to(dtype, w)).collect();
    common::assert_close_floor(what, &common::read(got), &want, rel(dtype), 1.0);
}

/// `(equation, letters-only reference equation, operand shapes)`.
type EinsumCase = (&'static str, &'static str, &'static [&'static [usize]]);

const CASES: [EinsumCase; 24] = [
    ("ii,ij->j", "ii,ij->j", &[&[3, 3], &[3, 4]]),
    ("i,->i", "i,->i", &[&[4], &[]]),
    ("ij,jk->ik", "ij,jk->ik", &[&[3, 4], &[4, 5]]),
    ("ij,jk", "ij,jk->ik", &[&[3, 4], &[4, 5]]),
    ("bij,bjk->bik", "bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]]),
    ("ii->i", "ii->i", &[&[4, 4]]),
    ("ii", "ii->", &[&[4, 4]]),
    ("iij->j", "iij->j", &[&[3, 3, 2]]),
    ("iii->i", "iii->i", &[&[3, 3, 3]]),
    ("jii->ij", "jii->ij", &[&[2, 3, 3]]),
    ("ij->ji", "ij->ji", &[&[3, 5]]),
    ("ij->", "ij->", &[&[3, 5]]),
    ("ij->j", "ij->j", &[&[3, 5]]),
    ("i,i->", "i,i->", &[&[6], &[6]]),
    ("i,j->ij", "i,j->ij", &[&[3], &[4]]),
    ("ij,ij->ij", "ij,ij->ij", &[&[3, 4], &[3, 4]]),
    ("ba,ac", "ba,ac->bc", &[&[2, 3], &[3, 4]]),
    ("Ab,bC", "Ab,bC->AC", &[&[2, 3], &[3, 4]]),
    (
        "...ij,...jk->...ik",
        "YZij,Zjk->YZik",
        &[&[2, 1, 3, 4], &[5, 4, 2]],
    ),
    ("...ij->...ji", "Zij->Zji", &[&[2, 3, 4]]),
    ("i...->...", "iYZ->YZ", &[&[3, 2, 4]]),
    (
        "bn,anm,bm->ba",
        "bn,anm,bm->ba",
        &[&[2, 3], &[4, 3, 5], &[2, 5]],
    ),
    ("ij,jk->ik", "ij,jk->ik", &[&[0, 3], &[3, 2]]),
    ("ij,jk->ik", "ij,jk->ik", &[&[2, 0], &[0, 3]]),
];

#[test]
fn einsum_equations_f32() -> Result<()> {
    let mut rng = Rng::new(21);
    for (equation, ref_eq, shapes) in CASES {
        let ops: Vec<(Tensor, Vec<f64>)> = shapes
            .iter()
            .map(|d| operand(&mut rng, DType::F32, d))
            .collect();
        let tensors: Vec<&Tensor> = ops.iter().map(|(t, _)| t).collect();
        let got = Tensor::einsum(equation, &tensors)?;
        let inputs: Vec<(&[f64], &[usize])> = ops
            .iter()
            .zip(shapes)
            .map(|((_, v), d)| (&v[..], *d))
            .collect();
        let (want, dims) = reference(ref_eq, &inputs);
        check(equation, &got, DType::F32, &want, &dims);
    }
    Ok(())
}

#[test]
fn einsum_every_dtype_and_size_one() -> Result<()> {
    let mut rng = Rng::new(22);
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
    ];
    for dtype in common::on_device(dtypes) {
        for (equation, shapes) in [
            ("ij,jk->ik", &[&[3usize, 4][..], &[4, 5]][..]),
            ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]]),
            ("ii->i", &[&[4, 4]]),
            ("ij->j", &[&[3, 5]]),
            ("ij,jk->ik", &[&[1, 1], &[1, 1]]),
        ] {
            let ops: Vec<(Tensor, Vec<f64>)> =
                shapes.iter().map(|d| operand(&mut rng, dtype, d)).collect();
            let tensors: Vec<&Tensor> = ops.iter().map(|(t, _)| t).collect();
            let got = Tensor::einsum(equation, &tensors)?;
            let inputs: Vec<(&[f64], &[usize])> = ops
                .iter()
                .zip(shapes)
                .map(|((_, v), d)| (&v[..], *d))
                .collect();
            let (want, dims) = reference(equation, &inputs);
            check(&format!("{equation} {dtype}"), &got, dtype, &want, &dims);
        }
    }
    Ok(())
}

#[test]
fn einsum_non_contiguous_and_mixed_dtypes() -> Result<()> {
    let mut rng = Rng::new(23);
    for layout in Layout::VIEWS {
        let values = common::random(&mut rng, DType::F32, 21, DOMAIN);
        let (a, va) = common::view(layout, DType::F32, &values, 7, 3, 99.0);
        let (b, vb) = operand(&mut rng, DType::F64, &[3, 2]);
        let got = Tensor::einsum("ij,jk->ik", &[&a, &b])?;
        let (want, dims) = reference("ij,jk->ik", &[(&va, &[7, 3]), (&vb, &[3, 2])]);
        check(&format!("{layout:?}"), &got, DType::F64, &want, &dims);
        let got = Tensor::einsum("ij->j", &[&a])?;
        let (want, dims) = reference("ij->j", &[(&va, &[7, 3])]);
        check(&format!("{layout:?} sum"), &got, DType::F32, &want, &dims);
    }
    // A transposed square operand: the diagonal of a view.
    let (base, vb) = operand(&mut rng, DType::F32, &[4, 4]);
    let t = base.t()?;
    let vt: Vec<f64> = (0..16).map(|i| vb[(i % 4) * 4 + i / 4]).collect();
    let (want, dims) = reference("ij->ij", &[(&vt, &[4, 4])]);
    check(
        "t",
        &Tensor::einsum("ij->ij", &[&t])?,
        DType::F32,
        &want,
        &dims,
    );
    let (want, dims) = reference("ii->i", &[(&vt, &[4, 4])]);
    check(
        "t diag",
        &Tensor::einsum("ii->i", &[&t])?,
        DType::F32,
        &want,
        &dims,
    );
    Ok(())
}

fn bad(what: &str, res: Result<Tensor>, mentions: &[&str]) {
    common::assert_err(what, res, common::invalid("einsum"), mentions);
}

#[test]
fn einsum_errors_name_the_problem() {
    let m = Tensor::from([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    let v = Tensor::from([1.0f32, 2.0, 3.0, 4.0]);
    bad(
        "bad char",
        Tensor::einsum("ij,j#->i", &[&m, &v]),
        &["'#'", "position 4"],
    );
    bad(
        "operand count",
        Tensor::einsum("ij,jk->ik", &[&m]),
        &["2 operand terms", "1 operands"],
    );
    bad(
        "rank",
        Tensor::einsum("ijk->i", &[&m]),
        &["[2, 3]", "3 dims"],
    );
    bad(
        "size",
        Tensor::einsum("ij,j->i", &[&m, &v]),
        &["'j'", "3", "4"],
    );
    bad("output", Tensor::einsum("ij->iz", &[&m]), &["'z'"]);
    bad(
        "output twice",
        Tensor::einsum("ij->ii", &[&m]),
        &["'i'", "more than once"],
    );
    bad(
        "two ellipses",
        Tensor::einsum("...i...->i", &[&m]),
        &["second '...'"],
    );
    bad(
        "diagonal sizes",
        Tensor::einsum("ii->i", &[&m]),
        &["'i'", "2", "3"],
    );
    common::assert_err(
        "bool",
        Tensor::einsum("i->", &[&Tensor::from([true, false])]),
        common::unsupported("einsum", DType::Bool),
        &["einsum"],
    );
}

// =====================================================================================
// tensordot, outer, bmm, baddbmm, cross
// =====================================================================================

#[test]
fn tensordot_count_and_pairs() -> Result<()> {
    let mut rng = Rng::new(24);
    for dtype in common::on_device([DType::F32, DType::F64, DType::I64]) {
        let (a, va) = operand(&mut rng, dtype, &[2, 3, 4]);
        let (b, vb) = operand(&mut rng, dtype, &[3, 4, 5]);
        let (want, dims) = reference("ijk,jkl->il", &[(&va, &[2, 3, 4]), (&vb, &[3, 4, 5])]);
        check(
            &format!("dims=2 {dtype}"),
            &a.tensordot(&b, 2)?,
            dtype,
            &want,
            &dims,
        );
        let (want, dims) = reference("ijk,lmn->ijklmn", &[(&va, &[2, 3, 4]), (&vb, &[3, 4, 5])]);
        check(
            &format!("dims=0 {dtype}"),
            &a.tensordot(&b, 0)?,
            dtype,
            &want,
            &dims,
        );
        let (c, vc) = operand(&mut rng, dtype, &[4, 5, 2]);
        let got = a.tensordot_dims(&c, &[0, -1], &[2, 0])?;
        let (want, dims) = reference("ijk,kmi->jm", &[(&va, &[2, 3, 4]), (&vc, &[4, 5, 2])]);
        check(&format!("pairs {dtype}"), &got, dtype, &want, &dims);
    }
    let a = Tensor::ones([2, 3], DType::F32);
    common::assert_err(
        "size",
        a.tensordot_dims(&a, &[1], &[0]),
        common::invalid("tensordot"),
        &["[2, 3]", "size 3", "size 2"],
    );
    common::assert_err(
        "count",
        a.tensordot(&a, 3),
        common::invalid("tensordot"),
        &["3 dims"],
    );
    common::assert_err(
        "repeat",
        a.tensordot_dims(&a, &[0, 0], &[0, 0]),
        common::invalid("tensordot"),
        &["once"],
    );
    Ok(())
}

#[test]
fn outer_and_bmm() -> Result<()> {
    let mut rng = Rng::new(25);
    for dtype in common::on_device([DType::F32, DType::F64, DType::F16, DType::I32]) {
        let (x, vx) = operand(&mut rng, dtype, &[5]);
        let (y, vy) = operand(&mut rng, dtype, &[3]);
        let (want, dims) = reference("i,j->ij", &[(&vx, &[5]), (&vy, &[3])]);
        check(
            &format!("outer {dtype}"),
            &x.outer(&y)?,
            dtype,
            &want,
            &dims,
        );
        let (a, va) = operand(&mut rng, dtype, &[3, 2, 4]);
        let (b, vb) = operand(&mut rng, dtype, &[3, 4, 5]);
        let (want, dims) = reference("bij,bjk->bik", &[(&va, &[3, 2, 4]), (&vb, &[3, 4, 5])]);
        check(&format!("bmm {dtype}"), &a.bmm(&b)?, dtype, &want, &dims);
    }
    let (e, _) = operand(&mut rng, DType::F32, &[0]);
    assert_eq!(e.outer(&e)?.dims(), vec![0, 0]);
    let m = Tensor::ones([2, 3], DType::F32);
    common::assert_err(
        "outer 2-d",
        m.outer(&m),
        common::invalid("outer"),
        &["[2, 3]"],
    );
    let a = Tensor::ones([2, 2, 3], DType::F32);
    common::assert_err(
        "bmm 2-d",
        m.bmm(&a),
        common::invalid("bmm"),
        &["3-d", "[2, 3]"],
    );
    common::assert_err("bmm k", a.bmm(&a), common::invalid("bmm"), &["[2, 2, 3]"]);
    let b = Tensor::ones([3, 3, 3], DType::F32);
    common::assert_err(
        "bmm batch",
        a.bmm(&b),
        common::invalid("bmm"),
        &["[3, 3, 3]"],
    );
    Ok(())
}

#[test]
fn baddbmm_scales_and_broadcasts() -> Result<()> {
    let mut rng = Rng::new(26);
    for dtype in common::on_device([DType::F32, DType::F64]) {
        let (b1, v1) = operand(&mut rng, dtype, &[2, 3, 4]);
        let (b2, v2) = operand(&mut rng, dtype, &[2, 4, 5]);
        let (p, dims) = reference("bij,bjk->bik", &[(&v1, &[2, 3, 4]), (&v2, &[2, 4, 5])]);
        for (input_dims, beta, alpha) in [
            (&[2usize, 3, 5][..], 0.5, 2.0),
            (&[5], 1.0, 1.0),
            (&[1, 3, 1], -1.5, 0.25),
        ] {
            let (c, vc) = operand(&mut rng, dtype, input_dims);
            let got = c.baddbmm(&b1, &b2, beta, alpha)?;
            let (want, _) = common::broadcast_map(&[(&vc, input_dims), (&p, &dims)], |v| {
                beta * v[0] + alpha * v[1]
            });
            check(
                &format!("baddbmm {dtype} {input_dims:?}"),
                &got,
                dtype,
                &want,
                &dims,
            );
        }
        // beta = 0 ignores the input, NaN included.
        let nan = common::tensor(dtype, &[f64::NAN], &[1]);
        let got = nan.baddbmm(&b1, &b2, 0.0, 1.0)?;
        check(&format!("beta 0 {dtype}"), &got, dtype, &p, &dims);
    }
    let b = Tensor::ones([2, 3, 4], DType::F32);
    let c = Tensor::ones([2, 4, 5], DType::F32);
    common::assert_err(
        "input shape",
        Tensor::ones([4, 5], DType::F32).baddbmm(&b, &c, 1.0, 1.0),
        common::invalid("baddbmm"),
        &["[4, 5]", "[2, 3, 5]"],
    );
    Ok(())
}

fn cross_ref(a: &[f64], b: &[f64]) -> [f64; 3] {
    [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ]
}

#[test]
fn cross_products() -> Result<()> {
    let mut rng = Rng::new(27);
    for dtype in common::on_device([DType::F32, DType::F64, DType::BF16, DType::I64]) {
        // Last dim, with the second operand broadcast from [1, 3].
        let (a, va) = operand(&mut rng, dtype, &[4, 3]);
        let (b, vb) = operand(&mut rng, dtype, &[1, 3]);
        let want: Vec<f64> = (0..4)
            .flat_map(|i| cross_ref(&va[i * 3..i * 3 + 3], &vb))
            .collect();
        check(
            &format!("cross {dtype}"),
            &a.cross(&b, -1)?,
            dtype,
            &want,
            &[4, 3],
        );
        // Dim 0 of a permuted [3, 7] view.
        let values = common::random(&mut rng, dtype, 21, DOMAIN);
        let (v, vv) = common::view(Layout::Permuted, dtype, &values, 7, 3, 0.0);
        let (p, vp) = (
            v.t()?,
            (0..21).map(|i| vv[(i % 7) * 3 + i / 7]).collect::<Vec<_>>(),
        );
        let (q, vq) = operand(&mut rng, dtype, &[3, 7]);
        let mut want = vec![0.0; 21];
        for j in 0..7 {
            let col = |x: &[f64]| [x[j], x[7 + j], x[14 + j]];
            let c = cross_ref(&col(&vp), &col(&vq));
            for k in 0..3 {
                want[k * 7 + j] = c[k];
            }
        }
        check(
            &format!("cross dim 0 {dtype}"),
            &p.cross(&q, 0)?,
            dtype,
            &want,
            &[3, 7],
        );
    }
    let (e, _) = operand(&mut rng, DType::F32, &[0, 3]);
    assert_eq!(e.cross(&e, 1)?.dims(), vec![0, 3]);
    let m = Tensor::ones([2, 3], DType::F32);
    common::assert_err(
        "dim size",
        m.cross(&m, 0),
        common::invalid("cross"),
        &["size 3", "[2, 3]"],
    );
    common::assert_err(
        "dim range",
        m.cross(&m, 2),
        |e| matches!(e, Error::Shape(_)),
        &["cross"],
    );
    Ok(())
}

/// The p-norm of `values` (∞ for the max norm).
fn p_norm(values: &[f64], p: f64) -> f64 {
    if p.is_infinite() {
        values.iter().fold(0.0, |m, v| m.max(v.abs()))
    } else {
        values
            .iter()
            .map(|v| v.abs().powf(p))
            .sum::<f64>()
            .powf(1.0 / p)
    }
}

#[test]
fn normalize_and_cosine_similarity() -> Result<()> {
    let mut rng = Rng::new(28);
    for dtype in common::on_device([DType::F32, DType::F64, DType::F16, DType::I32]) {
        let result = if dtype.is_float() { dtype } else { DType::F32 };
        let values = common::random(&mut rng, dtype, 21, DOMAIN);
        // A permuted [7, 3] view; its rows are the vectors for dim 1, columns for dim 0.
        let (x, v) = common::view(Layout::Permuted, dtype, &values, 7, 3, 0.0);
        for p in [1.0, 2.0, 3.0, f64::INFINITY] {
            for (dim, lines, len) in [(1i64, 7usize, 3usize), (0, 3, 7)] {
                let at = |line: usize, k: usize| if dim == 1 { line * 3 + k } else { k * 3 + line };
                let mut want = vec![0.0; 21];
                for line in 0..lines {
                    let vec: Vec<f64> = (0..len).map(|k| v[at(line, k)]).collect();
                    let n = p_norm(&vec, p).max(1e-12);
                    for k in 0..len {
                        want[at(line, k)] = v[at(line, k)] / n;
                    }
                }
                let got = x.normalize(p, dim, 1e-12)?;
                check(
                    &format!("normalize {dtype} p={p} dim={dim}"),
                    &got,
                    result,
                    &want,
                    &[7, 3],
                );
            }
        }
        // Cosine similarity of the rows against a broadcast [3] vector, and a zero row.
        let w = common::random(&mut rng, dtype, 3, DOMAIN);
        let tw = common::tensor(dtype, &w, &[3]);
        let got = x.cosine_similarity(&tw, 1, 1e-8)?;
        let want: Vec<f64> = (0..7)
            .map(|i| {
                let r = &v[i * 3..i * 3 + 3];
                let dot: f64 = r.iter().zip(&w).map(|(a, b)| a * b).sum();
                let n1: f64 = r.iter().map(|a| a * a).sum();
                let n2: f64 = w.iter().map(|b| b * b).sum();
                dot / (n1 * n2).max(1e-16).sqrt()
            })
            .collect();
        check(
            &format!("cosine_similarity {dtype}"),
            &got,
            result,
            &want,
            &[7],
        );
        let zeros = common::tensor(dtype, &[0.0; 3], &[3]);
        let got = zeros.cosine_similarity(&tw, 0, 1e-8)?;
        check(&format!("cosine zero {dtype}"), &got, result, &[0.0], &[]);
    }
    let m = Tensor::ones([2, 3], DType::F32);
    common::assert_err(
        "p",
        m.normalize(-1.0, 1, 1e-12),
        common::invalid("normalize"),
        &["p must be positive"],
    );
    common::assert_err(
        "dim",
        m.normalize(2.0, 2, 1e-12),
        common::shape_error,
        &["normalize"],
    );
    common::assert_err(
        "cos shapes",
        m.cosine_similarity(&Tensor::ones([4], DType::F32), 1, 1e-8),
        common::shape_error,
        &["cosine_similarity", "[2, 3]", "[4]"],
    );
    assert_eq!(
        Tensor::ones([0, 3], DType::F32)
            .normalize(2.0, 1, 1e-12)?
            .dims(),
        vec![0, 3]
    );
    Ok(())
}
