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
