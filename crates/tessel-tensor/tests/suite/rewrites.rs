//! The e-graph's rewrites seen through the Tensor API: identities that simplify, on every
//! backend, still give the recorded computation's values; a target that simplifies to an
//! input (or to another target) still gets its own buffer.

use crate::common::nd::{Nd, assert_nd};
use crate::common::{Domain, Rng};
use tessel_tensor::{DType, Result, Tensor};

fn random(seed: u64, dims: &[usize]) -> (Tensor, Nd) {
    let r = Nd::random(
        &mut Rng::new(seed),
        DType::F32,
        dims,
        Domain::new((-3.0, 3.0), (0, 0)),
    );
    (r.tensor(DType::F32), r)
}

#[test]
fn identities_simplify_to_the_same_values() -> Result<()> {
    let (x, xr) = random(11, &[6, 5]);
    let (y, yr) = random(12, &[6, 5]);
    // x·1 + (−(−y)) permuted twice back to its shape, then exp(log(exp x)).
    let t = x.mul(1.0)?.add(&y.neg()?.neg()?)?;
    let t = t.permute(&[1, 0])?.permute(&[1, 0])?;
    let e = x.exp().log().exp();
    let want_t = Nd::from_fn(&[6, 5], |i| xr.at(i) + yr.at(i));
    let want_e = Nd::from_fn(&[6, 5], |i| xr.at(i).exp());
    Tensor::realize_all(&[&t, &e])?;
    assert_nd("x*1 + --y", &Nd::of(&t), &want_t, 1e-6);
    assert_nd("exp(log(exp x))", &Nd::of(&e), &want_e, 1e-5);
    Ok(())
}

#[test]
fn sums_of_sums_and_integer_self_subtraction() -> Result<()> {
    let (a, ar) = random(13, &[4, 7]);
    let (b, br) = random(14, &[4, 7]);
    let s = a.sum(&[1], false)?.add(&b.sum(&[1], false)?)?;
    let want = Nd::from_fn(&[4], |i| {
        (0..7).map(|j| ar.at(&[i[0], j]) + br.at(&[i[0], j])).sum()
    });
    assert_nd("sum a + sum b", &Nd::of(&s), &want, 1e-5);

    let k = Tensor::arange(0i32, 10i32, 1i32)?.cast(DType::I32);
    let zero = k.sub(&k)?.add(&k)?;
    assert_eq!(zero.to_vec::<i32>()?, (0..10).collect::<Vec<i32>>());
    Ok(())
}

#[test]
fn targets_that_simplify_to_an_input_or_to_each_other_get_their_own_buffers() -> Result<()> {
    let (x, xr) = random(15, &[3, 4]);
    x.realize()?;
    let same = x.mul(1.0)?;
    let twin = x.add(-0.0)?.mul(1.0)?;
    Tensor::realize_all(&[&same, &twin])?;
    assert_nd("x*1", &Nd::of(&same), &xr, 0.0);
    assert_nd("(x + -0)*1", &Nd::of(&twin), &xr, 0.0);
    // Each is a value of its own: dropping the input leaves both intact.
    drop(x);
    assert_nd("x*1 after x is dropped", &Nd::of(&same), &xr, 0.0);
    Ok(())
}

/// Attention scores after a head split: `k.transpose(-2, -1)` composes with the split
/// into one permute, and the e-graph's transposed form reads `k` transposed
/// instead. Whatever the measured plan mixes from the two forms gives the scores.
#[test]
fn attention_scores_in_either_operand_layout() -> Result<()> {
    let (b, s, h, d) = (2usize, 16usize, 4usize, 8usize);
    let (qkv, r) = random(15, &[b, s, 3 * h * d]);
    let heads = |i: i64| -> Result<Tensor> {
        qkv.reshape(&[b as i64, s as i64, 3, h as i64, d as i64])?
            .narrow(2, i, 1)?
            .reshape(&[b as i64, s as i64, h as i64, d as i64])?
            .permute(&[0, 2, 1, 3])
    };
    let scores = (heads(0)?.matmul(&heads(1)?.transpose(-2, -1)?)? * 0.5)?.softmax(-1)?;
    // [b, s, 3, h, d] → the element of part `p`, head `hh`, position `t`, channel `c`.
    let at =
        |n: usize, p: usize, hh: usize, t: usize, c: usize| r.at(&[n, t, (p * h + hh) * d + c]);
    let logits = Nd::from_fn(&[b, h, s, s], |i| {
        let (n, hh, t, u) = (i[0], i[1], i[2], i[3]);
        0.5 * (0..d)
            .map(|c| at(n, 0, hh, t, c) * at(n, 1, hh, u, c))
            .sum::<f64>()
    });
    let want = Nd::from_fn(&[b, h, s, s], |i| {
        let row = |u: usize| logits.at(&[i[0], i[1], i[2], u]);
        let max = (0..s).map(row).fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = (0..s).map(|u| (row(u) - max).exp()).sum();
        (row(i[3]) - max).exp() / sum
    });
    assert_nd("softmax(q k^T / 2)", &Nd::of(&scores), &want, 1e-5);
    Ok(())
}

/// A whole attention over heads split out of one projection (`narrow` of GPT-2's `c_attn`
/// rows, viewed as heads), its output's heads merged back: whether the plan copies the
/// heads out or the attention reads and writes them in place, the values are the same.
#[test]
fn attention_over_heads_split_out_of_a_projection() -> Result<()> {
    let (b, s, h, d) = (2usize, 19usize, 3usize, 8usize);
    let (qkv, r) = random(18, &[b, s, 3 * h * d]);
    let (bi, si, hi, di) = (b as i64, s as i64, h as i64, d as i64);
    let heads = |p: i64| -> Result<Tensor> {
        qkv.narrow(2, p * hi * di, hi * di)?
            .reshape(&[bi, si, hi, di])?
            .permute(&[0, 2, 1, 3])
    };
    let scores = (heads(0)?.matmul(&heads(1)?.transpose(-2, -1)?)? * 0.25)?.softmax(-1)?;
    let out = scores
        .matmul(&heads(2)?)?
        .permute(&[0, 2, 1, 3])?
        .reshape(&[bi, si, hi * di])?;
    let at =
        |n: usize, p: usize, hh: usize, t: usize, c: usize| r.at(&[n, t, (p * h + hh) * d + c]);
    let want = Nd::from_fn(&[b, s, h * d], |i| {
        let (n, t, hh, c) = (i[0], i[1], i[2] / d, i[2] % d);
        let logit = |u: usize| {
            0.25 * (0..d)
                .map(|x| at(n, 0, hh, t, x) * at(n, 1, hh, u, x))
                .sum::<f64>()
        };
        let max = (0..s).map(logit).fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = (0..s).map(|u| (logit(u) - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        (0..s).map(|u| weights[u] * at(n, 2, hh, u, c)).sum::<f64>() / total
    });
    assert_nd("attention over split heads", &Nd::of(&out), &want, 1e-5);
    Ok(())
}

/// `plan_to_dot` plans without running: it shows the programs the plan was chosen from
/// (the chosen ones filled), caches the plan, and the realize that follows compiles
/// nothing and gives the right values.
#[test]
fn plan_to_dot_shows_the_plan_the_realize_then_runs() -> Result<()> {
    let (a, ar) = random(16, &[24, 12]);
    let (w, wr) = random(17, &[12, 20]);
    a.realize()?;
    w.realize()?;
    let y = a.matmul(&w)?.relu();
    let dot = tessel_tensor::inspect::plan_to_dot(&[&y])?.expect("y is not realized yet");
    assert!(dot.starts_with("digraph plan {"), "{dot}");
    assert!(
        dot.contains("style=\"filled,bold\""),
        "a chosen program: {dot}"
    );
    assert!(dot.contains("penwidth=3"), "the target value: {dot}");
    let report = y.realize()?;
    assert_eq!(
        report.kernels_prepared(),
        0,
        "the plan was made by plan_to_dot"
    );
    let want = Nd::from_fn(&[24, 20], |i| {
        (0..12)
            .map(|k| ar.at(&[i[0], k]) * wr.at(&[k, i[1]]))
            .sum::<f64>()
            .max(0.0)
    });
    assert_nd("relu(a @ w)", &Nd::of(&y), &want, 1e-5);
    assert!(tessel_tensor::inspect::plan_to_dot(&[&y])?.is_none());
    Ok(())
}

/// `(a @ b).t()` and a batched `(q @ kᵀ)ᵀ`: `matmul-transpose` computes them as `bᵀ·aᵀ`
/// (in the transposed form), and whatever the measured plan picks gives the values.
#[test]
fn transposed_products_give_the_product_transposed() -> Result<()> {
    let (a, ar) = random(18, &[7, 5]);
    let (b, br) = random(19, &[5, 6]);
    let y = a.matmul(&b)?.t()?;
    let want = Nd::from_fn(&[6, 7], |i| {
        (0..5).map(|k| ar.at(&[i[1], k]) * br.at(&[k, i[0]])).sum()
    });
    assert_nd("(a @ b).t()", &Nd::of(&y), &want, 1e-5);
    let (q, qr) = random(20, &[3, 8, 4]);
    let (k, kr) = random(21, &[3, 8, 4]);
    let s = q.matmul(&k.transpose(-2, -1)?)?.transpose(-2, -1)?.relu();
    let want = Nd::from_fn(&[3, 8, 8], |i| {
        (0..4)
            .map(|c| qr.at(&[i[0], i[2], c]) * kr.at(&[i[0], i[1], c]))
            .sum::<f64>()
            .max(0.0)
    });
    assert_nd("relu((q @ kᵀ)ᵀ)", &Nd::of(&s), &want, 1e-5);
    Ok(())
}
