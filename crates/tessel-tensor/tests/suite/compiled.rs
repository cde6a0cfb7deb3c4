//! `Compiled`: a function recorded once and replayed on new arguments gives what the same
//! ops recorded each time give, reads what it captured as it was when compiled, and says
//! why where it cannot compile or be called.

use crate::common::nd::{Nd, assert_nd, reduce_tol};
use crate::dynamic::{bias_relu_ref, random, softmax_ref};
use tessel_tensor::{Compiled, DType, Error, Result};

/// Row sums, keeping the axis.
fn row_sums_ref(x: &Nd) -> Nd {
    let n = *x.dims.last().expect("a matrix");
    let data = x.data.chunks(n).map(|r| r.iter().sum()).collect();
    Nd::new(&[x.dims[0], 1], data)
}

/// A two-layer MLP compiled with the input and the second weight as arguments (the first
/// layer's weight and bias captured), called on four new inputs and two second weights:
/// each call gives the reference's values for its arguments and the captured weights as
/// they were when compiled, even after those tensors are assigned new values.
#[test]
fn a_compiled_function_replays_on_new_arguments() -> Result<()> {
    let (w1r, b1r) = (random(4, &[16, 32]), random(5, &[32]));
    let (w1, b1) = (w1r.tensor(DType::F32), b1r.tensor(DType::F32));
    let x0 = random(10, &[9, 16]).tensor(DType::F32);
    let w2_0 = random(11, &[32, 10]).tensor(DType::F32);
    let f = Compiled::new(&[&x0, &w2_0], |a| {
        let h = (&a[0].matmul(&w1)? + &b1)?.relu();
        Ok(vec![h.matmul(&a[1])?.softmax(-1)?, h.sum(&[-1], true)?])
    })?;
    assert!(f.launches() > 0);
    // Captured tensors keep their values at compile time.
    w1.assign(&random(6, &[16, 32]).tensor(DType::F32))?;
    let h_ref = |xr: &Nd| bias_relu_ref(&xr.matmul(&w1r), &b1r);
    for round in 0..4 {
        let xr = random(20 + round, &[9, 16]);
        let w2r = random(30 + round / 2, &[32, 10]);
        let out = f.call(&[&xr.tensor(DType::F32), &w2r.tensor(DType::F32)])?;
        assert_eq!(out.len(), 2);
        let tol = reduce_tol(DType::F32, 32);
        let h = h_ref(&xr);
        let probs = softmax_ref(&h.matmul(&w2r));
        assert_nd(
            &format!("probs, call {round}"),
            &Nd::of(&out[0]),
            &probs,
            tol,
        );
        let sums = row_sums_ref(&h);
        assert_nd(
            &format!("row sums, call {round}"),
            &Nd::of(&out[1]),
            &sums,
            tol,
        );
        // Outputs are ordinary tensors: they compose with recorded ops.
        let twice = (&out[1] * 2.0)?;
        let doubled = Nd::new(&sums.dims, sums.data.iter().map(|v| v * 2.0).collect());
        assert_nd("an output used further", &Nd::of(&twice), &doubled, tol);
    }
    // Unrealized arguments are realized first.
    let xr = random(40, &[9, 16]);
    let x = (&xr.tensor(DType::F32) * 1.0)?;
    let w2r = random(41, &[32, 10]);
    let out = f.call(&[&x, &w2r.tensor(DType::F32)])?;
    let probs = softmax_ref(&h_ref(&xr).matmul(&w2r));
    assert_nd(
        "lazy argument",
        &Nd::of(&out[0]),
        &probs,
        reduce_tol(DType::F32, 32),
    );
    Ok(())
}

fn error_of<T>(what: &str, r: Result<T>) -> Error {
    match r {
        Ok(_) => panic!("{what}: expected an error"),
        Err(e) => e,
    }
}

fn assert_mentions(what: &str, e: &Error, op: &str, words: &[&str]) {
    let msg = e.to_string();
    assert!(msg.contains(op), "{what}: {msg:?} does not name {op}");
    for w in words {
        assert!(msg.contains(w), "{what}: {msg:?} does not mention {w:?}");
    }
}

#[test]
fn compiling_and_calling_say_what_is_wrong() -> Result<()> {
    let x = random(1, &[4, 3]).tensor(DType::F32);
    let y = random(2, &[4, 3]).tensor(DType::F32);
    let f = Compiled::new(&[&x, &y], |a| Ok(vec![(&a[0] + &a[1])?]))?;

    let e = error_of("too few", f.call(&[&x]));
    assert_mentions(
        "too few",
        &e,
        "Compiled::call",
        &["1 arguments", "compiled for 2"],
    );
    let wide = random(3, &[4, 5]).tensor(DType::F32);
    let e = error_of("shape", f.call(&[&x, &wide]));
    assert_mentions(
        "shape",
        &e,
        "Compiled::call",
        &["argument 1", "[4, 5]", "[4, 3]"],
    );
    let e = error_of("dtype", f.call(&[&x, &y.cast(DType::F64)]));
    assert_mentions("dtype", &e, "Compiled::call", &["argument 1", "f64"]);

    let e = error_of(
        "same tensor",
        Compiled::new(&[&x, &x], |a| Ok(vec![a[0].relu()])),
    );
    assert_mentions("same tensor", &e, "Compiled::new", &["arguments 0 and 1"]);
    let e = error_of(
        "argument out",
        Compiled::new(&[&x], |a| Ok(vec![a[0].clone()])),
    );
    assert_mentions(
        "argument out",
        &e,
        "Compiled::new",
        &["output 0", "computed values"],
    );
    let e = error_of("nothing out", Compiled::new(&[&x], |_| Ok(vec![])));
    assert_mentions("nothing out", &e, "Compiled::new", &["no tensor"]);
    // The function's own error comes back as it is.
    let e = error_of(
        "inner",
        Compiled::new(&[&x], |a| Ok(vec![a[0].matmul(&a[0])?])),
    );
    assert!(matches!(e, Error::Shape(_)), "{e:?}");
    Ok(())
}
