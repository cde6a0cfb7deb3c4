//! Shape rules: every rule, every error case, against torch's documented behaviour.

use tessel_shape::rules::{
    broadcast, broadcast_all, cat, chunk, conv, conv_out_dim, expand, flatten, flip, matmul,
    narrow, normalize_axes, normalize_axis, pad, permute, pool, pool_out_dim, reduce, repeat,
    reshape, slice, split, split_sizes, squeeze, stack, transpose, unsqueeze,
};
use tessel_shape::{Bindings, Dim, Shape, ShapeError, Var};

/// A constant shape.
fn s<const N: usize>(dims: [usize; N]) -> Shape {
    Shape::from(dims)
}

/// A shape of (possibly symbolic) dims.
fn sym(dims: &[Dim]) -> Shape {
    Shape::new(dims.to_vec())
}

fn c(v: i64) -> Dim {
    Dim::constant(v)
}

fn var(name: &str, lo: i64, hi: i64) -> (Var, Dim) {
    let v = Var::new(name, lo, hi).unwrap();
    (v, Dim::from(v))
}

/// Asserts the error variant, that `op()` and the message name the op, that the message
/// contains each needle, and that it doesn't end with a period.
macro_rules! check_err {
    ($res:expr, $pat:pat, $op:expr, [$($needle:expr),* $(,)?]) => {{
        let err = $res.expect_err("expected an error");
        assert!(matches!(err, $pat), "wrong variant: {err:?}");
        assert_eq!(err.op(), $op, "{err:?}");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("{}: ", $op)), "message {msg:?} should start with the op");
        $(assert!(msg.contains($needle), "message {msg:?} should contain {:?}", $needle);)*
        assert!(!msg.ends_with('.'), "message {msg:?} ends with a period");
        err
    }};
}

// === Shape ===

#[test]
fn shape_basics() {
    let (_, b) = var("batch", 1, 64);
    let shape = sym(&[c(2), c(3), b]);
    assert_eq!(shape.to_string(), "[2, 3, batch]");
    assert_eq!(Shape::scalar().to_string(), "[]");
    assert_eq!(shape.ndim(), 3);
    assert_eq!(shape[2], b);
    assert_eq!(shape[..2], [c(2), c(3)]);
    assert_eq!(shape.numel(), b * 6);
    assert_eq!(Shape::scalar().numel(), c(1));
    assert_eq!(shape.as_usizes(), None);
    assert_eq!(s([2, 3]).as_usizes(), Some(vec![2, 3]));
    assert_eq!(Shape::from(vec![2usize, 3]), s([2, 3]));
    assert_eq!(Shape::from(&[2usize, 3][..]), s([2, 3]));
    assert_eq!(Shape::from(vec![c(2), c(3)]), s([2, 3]));
    assert_eq!(Shape::from(&[c(2), c(3)][..]), s([2, 3]));
    assert_eq!(s([4, 5]).dims(), &[c(4), c(5)]);
}

#[test]
fn contiguous_strides_and_check() {
    assert_eq!(s([2, 3, 4]).contiguous_strides(), [12, 4, 1].map(c));
    assert_eq!(s([2, 0, 3]).contiguous_strides(), [3, 3, 1].map(c));
    assert!(Shape::scalar().contiguous_strides().is_empty());
    let (_, b) = var("b", 1, 64);
    let shape = sym(&[b, c(3), c(4)]);
    let strides = shape.contiguous_strides();
    assert_eq!(strides, [c(12), c(4), c(1)]);
    let shape = sym(&[c(2), b, c(4)]);
    assert_eq!(shape.contiguous_strides(), [b * 4, c(4), c(1)]);
    assert!(shape.is_contiguous(&[b * 4, c(4), c(1)]));
    assert!(!shape.is_contiguous(&[c(4), c(4), c(1)]));

    let shape = s([2, 1, 3]);
    assert!(shape.is_contiguous(&[3, 3, 1].map(c)));
    assert!(
        shape.is_contiguous(&[3, 99, 1].map(c)),
        "size-1 strides don't matter"
    );
    assert!(!shape.is_contiguous(&[1, 3, 2].map(c)));
    assert!(!shape.is_contiguous(&[3, 1].map(c)), "wrong length");
    assert!(s([2, 0, 3]).is_contiguous(&[7, 7, 7].map(c)), "no elements");
    assert!(Shape::scalar().is_contiguous(&[]));
}

#[test]
fn axis_helpers() {
    let shape = s([2, 3, 4]);
    assert_eq!(normalize_axis("sum", -1, &shape), Ok(2));
    assert_eq!(normalize_axis("sum", -3, &shape), Ok(0));
    assert_eq!(normalize_axes("sum", &[-1, 0], &shape), Ok(vec![2, 0]));
    check_err!(
        normalize_axis("sum", 3, &shape),
        ShapeError::AxisOutOfRange {
            axis: 3,
            ndim: 3,
            ..
        },
        "sum",
        ["[2, 3, 4]", "-3..3", "axis 3"]
    );
    check_err!(
        normalize_axis("sum", -4, &shape),
        ShapeError::AxisOutOfRange { axis: -4, .. },
        "sum",
        ["[2, 3, 4]", "-3..3"]
    );
    check_err!(
        normalize_axis("sum", i64::MIN, &shape),
        ShapeError::AxisOutOfRange { .. },
        "sum",
        ["[2, 3, 4]"]
    );
    check_err!(
        normalize_axis("sum", 0, &Shape::scalar()),
        ShapeError::AxisOutOfRange { ndim: 0, .. },
        "sum",
        ["[]", "no axes"]
    );
    check_err!(
        normalize_axes("sum", &[0, -3], &shape),
        ShapeError::DuplicateAxis { axis: 0, .. },
        "sum",
        ["[0, -3]", "[2, 3, 4]"]
    );
}

#[test]
fn var_bounds_error() {
    let err = Var::new("x", 5, 1).unwrap_err();
    assert!(matches!(&err, ShapeError::InvalidVarBounds { name, lo: 5, hi: 1 } if name == "x"));
    assert_eq!(err.op(), "Var::new");
    let msg = err.to_string();
    assert!(
        msg.contains("\"x\"") && msg.contains('5') && msg.contains('1'),
        "{msg}"
    );
}

// === Broadcasting ===

#[test]
fn broadcast_constant() {
    let ok = |a: Shape, b: Shape, want: Shape| {
        assert_eq!(broadcast("add", &a, &b).unwrap(), want, "{a} with {b}");
        assert_eq!(broadcast("add", &b, &a).unwrap(), want, "{b} with {a}");
    };
    ok(s([2, 3]), s([2, 3]), s([2, 3]));
    ok(s([2, 3]), s([3]), s([2, 3]));
    ok(s([2, 3]), s([1, 3]), s([2, 3]));
    ok(s([4, 1, 3]), s([2, 1]), s([4, 2, 3]));
    ok(s([5, 1, 4, 1]), s([3, 1, 1]), s([5, 3, 4, 1]));
    ok(Shape::scalar(), s([2, 3]), s([2, 3]));
    ok(Shape::scalar(), Shape::scalar(), Shape::scalar());
    ok(s([0, 3]), s([1, 3]), s([0, 3]));
    ok(s([0]), s([1]), s([0]));
    ok(s([2, 0]), s([0]), s([2, 0]));
}

#[test]
fn broadcast_constant_errors() {
    let err = check_err!(
        broadcast("add", &s([2, 3]), &s([3, 3])),
        ShapeError::Broadcast { axis: -2, .. },
        "add",
        ["[2, 3]", "[3, 3]", "dim -2", "2 and 3", "neither is 1"]
    );
    assert!(
        matches!(err, ShapeError::Broadcast { lhs_dim, rhs_dim, .. } if lhs_dim == c(2) && rhs_dim == c(3))
    );
    check_err!(
        broadcast("mul", &s([0]), &s([3])),
        ShapeError::Broadcast { axis: -1, .. },
        "mul",
        ["[0]", "[3]"]
    );
    check_err!(
        broadcast("where", &s([4, 2, 3]), &s([5, 1, 3])),
        ShapeError::Broadcast { axis: -3, .. },
        "where",
        ["[4, 2, 3]", "[5, 1, 3]"]
    );
}

#[test]
fn broadcast_symbolic() {
    let (_, b) = var("b", 1, 64);
    let (_, cc) = var("c", 1, 64);
    let b3 = sym(&[b, c(3)]);
    assert_eq!(broadcast("add", &b3, &s([1, 3])).unwrap(), b3);
    assert_eq!(broadcast("add", &s([1, 3]), &b3).unwrap(), b3);
    assert_eq!(broadcast("add", &b3, &s([3])).unwrap(), b3);
    assert_eq!(broadcast("add", &b3, &sym(&[b, c(1)])).unwrap(), b3);
    // `2*b` and `b*2` are the same dim.
    assert_eq!(
        broadcast("add", &sym(&[b * 2]), &sym(&[2 * b])).unwrap(),
        sym(&[b * 2])
    );
    check_err!(
        broadcast("add", &b3, &sym(&[cc, c(3)])),
        ShapeError::Broadcast { axis: -2, .. },
        "add",
        ["[b, 3]", "[c, 3]", "b and c", "proven"]
    );
    // A dim that might be 1 is not provably 1.
    check_err!(
        broadcast("add", &sym(&[b]), &s([3])),
        ShapeError::Broadcast { .. },
        "add",
        ["[b]", "[3]", "proven"]
    );
}

#[test]
fn broadcast_many() {
    assert_eq!(broadcast_all("where", &[]).unwrap(), Shape::scalar());
    let (a, b, cc) = (s([2, 1]), s([1, 3]), s([4, 1, 1]));
    assert_eq!(
        broadcast_all("where", &[&a, &b, &cc]).unwrap(),
        s([4, 2, 3])
    );
    assert_eq!(broadcast_all("where", &[&a]).unwrap(), a);
    let bad = s([3, 1]);
    let err = check_err!(
        broadcast_all("where", &[&a, &b, &bad]),
        ShapeError::Broadcast { axis: -2, .. },
        "where",
        ["[2, 1]", "[3, 1]"]
    );
    // The error names the two input shapes that disagree, not an intermediate result.
    assert!(matches!(err, ShapeError::Broadcast { lhs, rhs, .. } if lhs == a && rhs == bad));
    // A 1 that came first is replaced, not reported.
    assert_eq!(
        broadcast_all("add", &[&s([1]), &s([5]), &s([1])]).unwrap(),
        s([5])
    );
}

#[test]
fn expand_rule() {
    assert_eq!(expand(&s([3, 1]), &[2, -1, 4]).unwrap(), s([2, 3, 4]));
    assert_eq!(expand(&s([3, 1]), &[3, 4]).unwrap(), s([3, 4]));
    assert_eq!(expand(&s([3, 1]), &[-1, -1]).unwrap(), s([3, 1]));
    assert_eq!(expand(&s([1]), &[0]).unwrap(), s([0]));
    assert_eq!(expand(&Shape::scalar(), &[2, 2]).unwrap(), s([2, 2]));
    let (_, b) = var("b", 1, 64);
    assert_eq!(expand(&s([1, 3]), &[b, c(-1)]).unwrap(), sym(&[b, c(3)]));
    assert_eq!(
        expand(&sym(&[b, c(1)]), &[b, c(5)]).unwrap(),
        sym(&[b, c(5)])
    );

    let err = check_err!(
        expand(&s([3, 2]), &[3, 4]),
        ShapeError::Expand { axis: 1, .. },
        "expand",
        ["[3, 2]", "[3, 4]", "size 1"]
    );
    assert!(
        matches!(err, ShapeError::Expand { dim, target_dim, .. } if dim == c(2) && target_dim == c(4))
    );
    check_err!(
        expand(&s([3, 1]), &[-1, 2, 1]),
        ShapeError::InvalidArgument { .. },
        "expand",
        ["[3, 1]", "-1", "leading"]
    );
    check_err!(
        expand(&s([2, 3]), &[3]),
        ShapeError::RankMismatch { .. },
        "expand",
        ["[2, 3]", "at most 1"]
    );
    check_err!(
        expand(&s([1, 3]), &[-2, 3]),
        ShapeError::InvalidArgument { .. },
        "expand",
        ["[1, 3]", "-2", "negative"]
    );
    check_err!(
        expand(&sym(&[b]), &[4]),
        ShapeError::Expand { axis: 0, .. },
        "expand",
        ["[b]", "[4]"]
    );
}

// === Reductions ===

#[test]
fn reduce_rule() {
    let shape = s([2, 3, 4]);
    assert_eq!(reduce("sum", &shape, None, false).unwrap(), Shape::scalar());
    assert_eq!(reduce("sum", &shape, None, true).unwrap(), s([1, 1, 1]));
    assert_eq!(reduce("sum", &shape, Some(&[1]), false).unwrap(), s([2, 4]));
    assert_eq!(
        reduce("sum", &shape, Some(&[1]), true).unwrap(),
        s([2, 1, 4])
    );
    assert_eq!(
        reduce("mean", &shape, Some(&[-1, 0]), false).unwrap(),
        s([3])
    );
    assert_eq!(
        reduce("mean", &shape, Some(&[-1, 0]), true).unwrap(),
        s([1, 3, 1])
    );
    assert_eq!(reduce("sum", &shape, Some(&[]), false).unwrap(), shape);
    assert_eq!(
        reduce("sum", &Shape::scalar(), None, true).unwrap(),
        Shape::scalar()
    );
    assert_eq!(
        reduce("sum", &Shape::scalar(), Some(&[0]), false).unwrap(),
        Shape::scalar()
    );
    assert_eq!(
        reduce("sum", &Shape::scalar(), Some(&[-1]), true).unwrap(),
        Shape::scalar()
    );
    let (_, b) = var("b", 1, 64);
    assert_eq!(
        reduce("amax", &sym(&[b, c(3)]), Some(&[1]), false).unwrap(),
        sym(&[b])
    );

    check_err!(
        reduce("sum", &shape, Some(&[0, -3]), false),
        ShapeError::DuplicateAxis { axis: 0, .. },
        "sum",
        ["[2, 3, 4]", "[0, -3]", "more than once"]
    );
    check_err!(
        reduce("amax", &shape, Some(&[3]), false),
        ShapeError::AxisOutOfRange { axis: 3, .. },
        "amax",
        ["[2, 3, 4]", "-3..3"]
    );
    check_err!(
        reduce("sum", &Shape::scalar(), Some(&[1]), false),
        ShapeError::AxisOutOfRange {
            axis: 1,
            ndim: 1,
            ..
        },
        "sum",
        ["[]"]
    );
}

// === Matmul ===

#[test]
fn matmul_ranks_like_torch() {
    let cases: &[(Shape, Shape, Shape)] = &[
        (s([3]), s([3]), Shape::scalar()),
        (s([2, 3]), s([3]), s([2])),
        (s([3]), s([3, 4]), s([4])),
        (s([2, 3]), s([3, 4]), s([2, 4])),
        (s([5, 1, 2, 3]), s([4, 3, 6]), s([5, 4, 2, 6])),
        (s([3]), s([7, 3, 4]), s([7, 4])),
        (s([7, 2, 3]), s([3]), s([7, 2])),
        (s([2, 3]), s([5, 3, 4]), s([5, 2, 4])),
        (s([5, 2, 3]), s([3, 4]), s([5, 2, 4])),
        (s([10, 2, 3]), s([10, 3, 4]), s([10, 2, 4])),
        (s([10, 1, 2, 3]), s([1, 7, 3, 4]), s([10, 7, 2, 4])),
        (s([0, 3]), s([3, 4]), s([0, 4])),
        (s([2, 0]), s([0, 4]), s([2, 4])),
        (s([0]), s([0]), Shape::scalar()),
    ];
    for (lhs, rhs, want) in cases {
        assert_eq!(&matmul(lhs, rhs).unwrap(), want, "{lhs} @ {rhs}");
    }
}

#[test]
fn matmul_errors() {
    check_err!(
        matmul(&Shape::scalar(), &s([3])),
        ShapeError::RankMismatch { .. },
        "matmul",
        ["[]", "at least 1"]
    );
    check_err!(
        matmul(&s([3]), &Shape::scalar()),
        ShapeError::RankMismatch { .. },
        "matmul",
        ["[]"]
    );
    let err = check_err!(
        matmul(&s([3]), &s([4])),
        ShapeError::MatmulMismatch { .. },
        "matmul",
        ["[3]", "[4]", "(3)", "(4)"]
    );
    assert!(
        matches!(err, ShapeError::MatmulMismatch { lhs_dim, rhs_dim, .. } if lhs_dim == c(3) && rhs_dim == c(4))
    );
    check_err!(
        matmul(&s([2, 3]), &s([4, 5])),
        ShapeError::MatmulMismatch { .. },
        "matmul",
        ["[2, 3]", "[4, 5]", "cannot be multiplied"]
    );
    check_err!(
        matmul(&s([2, 3]), &s([2])),
        ShapeError::MatmulMismatch { .. },
        "matmul",
        ["[2, 3]", "[2]"]
    );
    check_err!(
        matmul(&s([2]), &s([3, 3, 4])),
        ShapeError::MatmulMismatch { .. },
        "matmul",
        ["[2]", "[3, 3, 4]"]
    );
    // Batch dims that don't broadcast: the error names the full shapes, and the axis is
    // counted from the right of the full shapes.
    check_err!(
        matmul(&s([2, 2, 3]), &s([3, 3, 4])),
        ShapeError::Broadcast { axis: -3, .. },
        "matmul",
        ["[2, 2, 3]", "[3, 3, 4]"]
    );
}

#[test]
fn matmul_symbolic() {
    let (_, b) = var("b", 1, 64);
    let (_, n) = var("n", 1, 64);
    let (_, m) = var("m", 1, 64);
    assert_eq!(
        matmul(&sym(&[b, n, c(3)]), &sym(&[c(3), m])).unwrap(),
        sym(&[b, n, m])
    );
    assert_eq!(
        matmul(&sym(&[b, c(2), n]), &sym(&[c(1), n, c(4)])).unwrap(),
        sym(&[b, c(2), c(4)])
    );
    check_err!(
        matmul(&sym(&[c(2), n]), &sym(&[m, c(4)])),
        ShapeError::MatmulMismatch { .. },
        "matmul",
        ["[2, n]", "[m, 4]", "proven"]
    );
}

// === Reshape ===

#[test]
fn reshape_rule() {
    assert_eq!(reshape(&s([2, 6]), &[3, 4]).unwrap(), s([3, 4]));
    assert_eq!(reshape(&s([2, 6]), &[-1, 4]).unwrap(), s([3, 4]));
    assert_eq!(reshape(&s([2, 6]), &[-1]).unwrap(), s([12]));
    assert_eq!(reshape(&s([2, 6]), &[2, -1, 2]).unwrap(), s([2, 3, 2]));
    assert_eq!(reshape(&Shape::scalar(), &[1, 1]).unwrap(), s([1, 1]));
    assert_eq!(reshape(&s([1]), &[] as &[i64]).unwrap(), Shape::scalar());
    assert_eq!(reshape(&Shape::scalar(), &[-1]).unwrap(), s([1]));
    // Zero-size, like torch: `zeros(0, 3).reshape(-1, 3)` is `[0, 3]`.
    assert_eq!(reshape(&s([0, 3]), &[-1, 3]).unwrap(), s([0, 3]));
    assert_eq!(reshape(&s([0, 3]), &[-1]).unwrap(), s([0]));
    assert_eq!(reshape(&s([0, 3]), &[3, 0]).unwrap(), s([3, 0]));
    assert_eq!(reshape(&s([2, 6]), &[c(4), c(-1)]).unwrap(), s([4, 3]));
}

#[test]
fn reshape_errors() {
    let err = check_err!(
        reshape(&s([2, 6]), &[5, 2]),
        ShapeError::ReshapeNumel { .. },
        "reshape",
        ["[2, 6]", "[5, 2]", "12", "10"]
    );
    assert!(
        matches!(err, ShapeError::ReshapeNumel { from_numel, to_numel, .. } if from_numel == c(12) && to_numel == c(10))
    );
    check_err!(
        reshape(&s([2, 6]), &[5, -1]),
        ShapeError::ReshapeInfer { .. },
        "reshape",
        ["[2, 6]", "[5, -1]", "12", "not divisible by 5"]
    );
    check_err!(
        reshape(&s([2, 6]), &[-1, -1]),
        ShapeError::ReshapeInfer { .. },
        "reshape",
        ["[2, 6]", "[-1, -1]", "only one"]
    );
    check_err!(
        reshape(&s([0, 3]), &[-1, 0]),
        ShapeError::ReshapeInfer { .. },
        "reshape",
        ["[0, 3]", "[-1, 0]", "0 elements"]
    );
    check_err!(
        reshape(&s([6]), &[-1, 0]),
        ShapeError::ReshapeInfer { .. },
        "reshape",
        ["[6]", "[-1, 0]"]
    );
    check_err!(
        reshape(&s([2, 3]), &[-2, -3]),
        ShapeError::InvalidArgument { .. },
        "reshape",
        ["[2, 3]", "-2", "negative"]
    );
    check_err!(
        reshape(&s([2, 3]), &[] as &[i64]),
        ShapeError::ReshapeNumel { .. },
        "reshape",
        ["[2, 3]", "[]"]
    );
}

#[test]
fn reshape_symbolic() {
    let (_, b) = var("b", 1, 64);
    let (_, cc) = var("c", 1, 64);
    let b6 = sym(&[b, c(6)]);
    assert_eq!(reshape(&b6, &[c(-1), c(3)]).unwrap(), sym(&[b * 2, c(3)]));
    assert_eq!(reshape(&b6, &[b, c(-1)]).unwrap(), b6);
    assert_eq!(reshape(&b6, &[c(-1)]).unwrap(), sym(&[b * 6]));
    assert_eq!(reshape(&b6, &[c(6), b]).unwrap(), sym(&[c(6), b]));
    assert_eq!(reshape(&b6, &[b * 3, c(2)]).unwrap(), sym(&[b * 3, c(2)]));
    assert_eq!(reshape(&sym(&[b * 2, c(3)]), &[b, c(-1)]).unwrap(), b6);
    check_err!(
        reshape(&b6, &[c(-1), c(4)]),
        ShapeError::ReshapeInfer { .. },
        "reshape",
        ["[b, 6]", "[-1, 4]", "proven divisible"]
    );
    check_err!(
        reshape(&b6, &[cc, c(6)]),
        ShapeError::ReshapeNumel { .. },
        "reshape",
        ["[b, 6]", "[c, 6]", "proven equal"]
    );
    let (_, z) = var("z", 0, 8);
    check_err!(
        reshape(&b6, &[z, c(-1)]),
        ShapeError::ReshapeInfer { .. },
        "reshape",
        ["[b, 6]", "[z, -1]", "non-zero"]
    );
    let (_, neg) = var("neg", -2, 8);
    check_err!(
        reshape(&b6, &[neg, c(-1)]),
        ShapeError::InvalidArgument { .. },
        "reshape",
        ["[b, 6]", "neg", "non-negative"]
    );
}

// === Permute, transpose, squeeze, unsqueeze, flatten ===

#[test]
fn permute_and_transpose() {
    let shape = s([2, 3, 4]);
    assert_eq!(permute(&shape, &[2, 0, 1]).unwrap(), s([4, 2, 3]));
    assert_eq!(permute(&shape, &[-1, 0, 1]).unwrap(), s([4, 2, 3]));
    assert_eq!(permute(&Shape::scalar(), &[]).unwrap(), Shape::scalar());
    check_err!(
        permute(&shape, &[0, 1]),
        ShapeError::InvalidPermutation { .. },
        "permute",
        ["[0, 1]", "[2, 3, 4]", "2 entries", "expected 3"]
    );
    check_err!(
        permute(&shape, &[0, 1, -3]),
        ShapeError::DuplicateAxis { axis: 0, .. },
        "permute",
        ["[0, 1, -3]", "[2, 3, 4]"]
    );
    check_err!(
        permute(&shape, &[0, 1, 3]),
        ShapeError::AxisOutOfRange { axis: 3, .. },
        "permute",
        ["[2, 3, 4]", "-3..3"]
    );

    assert_eq!(transpose(&shape, 0, -1).unwrap(), s([4, 3, 2]));
    assert_eq!(transpose(&shape, 1, 1).unwrap(), shape);
    assert_eq!(transpose(&Shape::scalar(), 0, -1).unwrap(), Shape::scalar());
    check_err!(
        transpose(&shape, 0, 3),
        ShapeError::AxisOutOfRange { axis: 3, .. },
        "transpose",
        ["[2, 3, 4]"]
    );
    check_err!(
        transpose(&Shape::scalar(), 0, 1),
        ShapeError::AxisOutOfRange { axis: 1, .. },
        "transpose",
        ["[]"]
    );
}

#[test]
fn squeeze_rule() {
    let shape = s([1, 3, 1]);
    assert_eq!(squeeze(&shape, None).unwrap(), s([3]));
    assert_eq!(squeeze(&shape, Some(&[0])).unwrap(), s([3, 1]));
    assert_eq!(
        squeeze(&shape, Some(&[1])).unwrap(),
        shape,
        "squeezing a non-1 dim is a no-op"
    );
    assert_eq!(squeeze(&shape, Some(&[0, -1])).unwrap(), s([3]));
    assert_eq!(squeeze(&shape, Some(&[])).unwrap(), shape);
    assert_eq!(squeeze(&s([1, 1]), None).unwrap(), Shape::scalar());
    assert_eq!(squeeze(&Shape::scalar(), None).unwrap(), Shape::scalar());
    assert_eq!(
        squeeze(&Shape::scalar(), Some(&[0])).unwrap(),
        Shape::scalar()
    );
    let (_, b) = var("b", 1, 64);
    assert_eq!(
        squeeze(&sym(&[b, c(1)]), None).unwrap(),
        sym(&[b]),
        "b might be 1, not provably"
    );
    check_err!(
        squeeze(&shape, Some(&[0, -3])),
        ShapeError::DuplicateAxis { .. },
        "squeeze",
        ["[1, 3, 1]", "[0, -3]"]
    );
    check_err!(
        squeeze(&shape, Some(&[3])),
        ShapeError::AxisOutOfRange { .. },
        "squeeze",
        ["[1, 3, 1]", "-3..3"]
    );
}

#[test]
fn unsqueeze_rule() {
    let shape = s([2, 3]);
    assert_eq!(unsqueeze(&shape, 0).unwrap(), s([1, 2, 3]));
    assert_eq!(unsqueeze(&shape, 1).unwrap(), s([2, 1, 3]));
    assert_eq!(unsqueeze(&shape, 2).unwrap(), s([2, 3, 1]));
    assert_eq!(unsqueeze(&shape, -1).unwrap(), s([2, 3, 1]));
    assert_eq!(unsqueeze(&shape, -3).unwrap(), s([1, 2, 3]));
    assert_eq!(unsqueeze(&Shape::scalar(), 0).unwrap(), s([1]));
    assert_eq!(unsqueeze(&Shape::scalar(), -1).unwrap(), s([1]));
    check_err!(
        unsqueeze(&shape, 3),
        ShapeError::AxisOutOfRange {
            axis: 3,
            ndim: 3,
            ..
        },
        "unsqueeze",
        ["[2, 3]", "-3..3"]
    );
    check_err!(
        unsqueeze(&shape, -4),
        ShapeError::AxisOutOfRange { axis: -4, .. },
        "unsqueeze",
        ["[2, 3]"]
    );
}

#[test]
fn flatten_rule() {
    let shape = s([2, 3, 4]);
    assert_eq!(flatten(&shape, 0, -1).unwrap(), s([24]));
    assert_eq!(flatten(&shape, 1, 2).unwrap(), s([2, 12]));
    assert_eq!(flatten(&shape, 0, 1).unwrap(), s([6, 4]));
    assert_eq!(flatten(&shape, 1, 1).unwrap(), shape);
    assert_eq!(flatten(&Shape::scalar(), 0, -1).unwrap(), s([1]));
    assert_eq!(flatten(&s([2, 0, 3]), 0, -1).unwrap(), s([0]));
    let (_, b) = var("b", 1, 64);
    assert_eq!(
        flatten(&sym(&[b, c(3), c(4)]), 0, 1).unwrap(),
        sym(&[b * 3, c(4)])
    );
    check_err!(
        flatten(&shape, 2, 1),
        ShapeError::InvalidArgument { .. },
        "flatten",
        ["[2, 3, 4]", "comes after"]
    );
    check_err!(
        flatten(&shape, 0, 3),
        ShapeError::AxisOutOfRange { axis: 3, .. },
        "flatten",
        ["[2, 3, 4]"]
    );
}

// === Pad, narrow, slice, flip, repeat ===

#[test]
fn pad_rule() {
    let shape = s([2, 3]);
    assert_eq!(pad(&shape, &[(1, 2)]).unwrap(), s([2, 6]));
    assert_eq!(pad(&shape, &[(1, 1), (2, 0)]).unwrap(), s([4, 5]));
    assert_eq!(pad(&shape, &[]).unwrap(), shape);
    assert_eq!(pad(&shape, &[(-1, 0)]).unwrap(), s([2, 2]));
    assert_eq!(pad(&shape, &[(-2, -1)]).unwrap(), s([2, 0]));
    let (_, b) = var("b", 1, 64);
    assert_eq!(pad(&sym(&[b]), &[(1, 1)]).unwrap(), sym(&[b + 2]));
    assert_eq!(pad(&sym(&[b]), &[(-1, 0)]).unwrap(), sym(&[b - 1]));
    check_err!(
        pad(&shape, &[(-2, -2)]),
        ShapeError::InvalidArgument { .. },
        "pad",
        ["[2, 3]", "(-2, -2)", "gives -1, a negative size"]
    );
    check_err!(
        pad(&sym(&[b]), &[(-2, 0)]),
        ShapeError::InvalidArgument { .. },
        "pad",
        ["[b]", "gives b - 2", "proven non-negative"]
    );
    check_err!(
        pad(&shape, &[(0, 0), (0, 0), (1, 1)]),
        ShapeError::RankMismatch { .. },
        "pad",
        ["[2, 3]", "at least 3"]
    );
    check_err!(
        pad(&shape, &[(i64::MAX, 1)]),
        ShapeError::InvalidArgument { .. },
        "pad",
        ["[2, 3]", "overflows"]
    );
}

#[test]
fn narrow_rule() {
    let shape = s([5, 4]);
    assert_eq!(narrow(&shape, 0, 1, 3).unwrap(), s([3, 4]));
    assert_eq!(narrow(&shape, 0, -2, 2).unwrap(), s([2, 4]));
    assert_eq!(narrow(&shape, -1, 0, 4).unwrap(), s([5, 4]));
    assert_eq!(narrow(&shape, 0, 5, 0).unwrap(), s([0, 4]));
    let (_, b) = var("b", 4, 64);
    assert_eq!(narrow(&sym(&[b]), 0, 1, 3).unwrap(), s([3]));
    check_err!(
        narrow(&shape, 0, 3, 3),
        ShapeError::InvalidArgument { .. },
        "narrow",
        ["[5, 4]", "start 3 + length 3 exceeds"]
    );
    check_err!(
        narrow(&shape, 0, -6, 1),
        ShapeError::InvalidArgument { .. },
        "narrow",
        ["[5, 4]", "start -6"]
    );
    check_err!(
        narrow(&shape, 1, 0, -1),
        ShapeError::InvalidArgument { .. },
        "narrow",
        ["[5, 4]", "length -1"]
    );
    check_err!(
        narrow(&shape, 2, 0, 1),
        ShapeError::AxisOutOfRange { .. },
        "narrow",
        ["[5, 4]"]
    );
    check_err!(
        narrow(&sym(&[b]), 0, 2, 3),
        ShapeError::InvalidArgument { .. },
        "narrow",
        ["[b]", "can't be proven to fit"]
    );
    check_err!(
        narrow(&shape, 0, i64::MAX, i64::MAX),
        ShapeError::InvalidArgument { .. },
        "narrow",
        ["[5, 4]"]
    );
}

/// `len(range(n)[start:stop:step])` for `step > 0`, by Python's rules, counted by
/// enumerating the selected indices.
fn python_slice_len(n: i64, start: Option<i64>, stop: Option<i64>, step: i64) -> i64 {
    let adjust = |i: i64| {
        if i < 0 { (i + n).max(0) } else { i.min(n) }
    };
    let lo = start.map_or(0, adjust);
    let hi = stop.map_or(n, adjust);
    (0..n)
        .filter(|&i| i >= lo && i < hi && (i - lo) % step == 0)
        .count() as i64
}

#[test]
fn slice_matches_python() {
    // A few values straight from Python: `len(list(range(5))[a:b:c])`.
    let shape = s([5]);
    for (start, stop, step, want) in [
        (Some(-7), Some(3), 1, 3),
        (Some(3), Some(1), 1, 0),
        (Some(-2), None, 1, 2),
        (Some(1), Some(-1), 3, 1),
        (Some(4), Some(6), 2, 1),
        (None, None, 2, 3),
        (None, None, 4, 2),
        (Some(-1), Some(-7), 1, 0),
        (None, Some(-3), 1, 2),
    ] {
        assert_eq!(
            slice(&shape, 0, start, stop, step).unwrap(),
            s([want]),
            "[{start:?}:{stop:?}:{step}]"
        );
    }
    let bounds = std::iter::once(None).chain((-7..7).map(Some));
    for start in bounds.clone() {
        for stop in bounds.clone() {
            for step in 1..=4 {
                let want = python_slice_len(5, start, stop, step);
                let got = slice(&s([2, 5]), -1, start, stop, step).unwrap();
                assert_eq!(got, sym(&[c(2), c(want)]), "[{start:?}:{stop:?}:{step}]");
            }
        }
    }
}

#[test]
fn slice_symbolic() {
    let (bv, b) = var("b", 1, 64);
    let shape = sym(&[b]);
    assert_eq!(slice(&shape, 0, None, None, 1).unwrap(), shape);
    for start in [
        None,
        Some(0),
        Some(1),
        Some(3),
        Some(-1),
        Some(-3),
        Some(-70),
    ] {
        for stop in [
            None,
            Some(0),
            Some(2),
            Some(5),
            Some(-1),
            Some(-4),
            Some(100),
        ] {
            for step in 1..=3 {
                let out = slice(&shape, 0, start, stop, step).unwrap();
                for n in [1, 2, 3, 4, 5, 7, 10, 64] {
                    let got = out[0].eval(&Bindings::new().with(bv, n)).unwrap();
                    assert_eq!(
                        got,
                        python_slice_len(n, start, stop, step),
                        "b={n} [{start:?}:{stop:?}:{step}] gave {}",
                        out[0]
                    );
                }
            }
        }
    }
}

#[test]
fn slice_errors() {
    check_err!(
        slice(&s([5]), 0, None, None, 0),
        ShapeError::InvalidArgument { .. },
        "slice",
        ["[5]", "step 0", "positive"]
    );
    check_err!(
        slice(&s([5]), 0, None, None, -1),
        ShapeError::InvalidArgument { .. },
        "slice",
        ["[5]", "step -1", "flip"]
    );
    check_err!(
        slice(&s([5]), 1, None, None, 1),
        ShapeError::AxisOutOfRange { .. },
        "slice",
        ["[5]"]
    );
    // Huge values don't overflow.
    assert_eq!(
        slice(&s([5]), 0, Some(i64::MIN), Some(i64::MAX), i64::MAX).unwrap(),
        s([1])
    );
}

#[test]
fn flip_rule() {
    let shape = s([2, 3]);
    assert_eq!(flip(&shape, &[0, 1]).unwrap(), shape);
    assert_eq!(flip(&shape, &[-1]).unwrap(), shape);
    assert_eq!(flip(&Shape::scalar(), &[0]).unwrap(), Shape::scalar());
    check_err!(
        flip(&shape, &[1, -1]),
        ShapeError::DuplicateAxis { axis: 1, .. },
        "flip",
        ["[2, 3]", "[1, -1]"]
    );
    check_err!(
        flip(&shape, &[2]),
        ShapeError::AxisOutOfRange { .. },
        "flip",
        ["[2, 3]"]
    );
}

#[test]
fn repeat_rule() {
    assert_eq!(repeat(&s([2, 3]), &[2, 2]).unwrap(), s([4, 6]));
    assert_eq!(repeat(&s([3]), &[2, 1, 2]).unwrap(), s([2, 1, 6]));
    assert_eq!(repeat(&s([2, 3]), &[0, 1]).unwrap(), s([0, 3]));
    assert_eq!(repeat(&Shape::scalar(), &[]).unwrap(), Shape::scalar());
    assert_eq!(repeat(&Shape::scalar(), &[3]).unwrap(), s([3]));
    let (_, b) = var("b", 1, 64);
    assert_eq!(repeat(&sym(&[b]), &[3]).unwrap(), sym(&[b * 3]));
    check_err!(
        repeat(&s([2, 3]), &[2]),
        ShapeError::RankMismatch { .. },
        "repeat",
        ["[2, 3]", "at most 1"]
    );
    check_err!(
        repeat(&s([2]), &[usize::MAX]),
        ShapeError::InvalidArgument { .. },
        "repeat",
        ["[2]", "exceeds"]
    );
}

// === Cat, stack, split, chunk ===

#[test]
fn cat_rule() {
    let (a, b) = (s([2, 3]), s([2, 5]));
    assert_eq!(cat(&[&a, &b], -1).unwrap(), s([2, 8]));
    assert_eq!(cat(&[&a, &s([4, 3])], 0).unwrap(), s([6, 3]));
    assert_eq!(cat(&[&a], 0).unwrap(), a);
    assert_eq!(cat(&[&a, &s([0, 3])], 0).unwrap(), a);
    // Legacy: 1-d `[0]` tensors are skipped.
    assert_eq!(cat(&[&s([0]), &a, &s([0]), &a], 0).unwrap(), s([4, 3]));
    assert_eq!(cat(&[&s([0]), &s([0])], 0).unwrap(), s([0]));
    let (_, bv) = var("b", 1, 64);
    let (_, cv) = var("c", 1, 64);
    assert_eq!(
        cat(&[&sym(&[bv, c(3)]), &sym(&[cv, c(3)]), &s([2, 3])], 0).unwrap(),
        sym(&[bv + cv + 2, c(3)])
    );

    let err = check_err!(
        cat(&[&a, &s([3, 5])], 1),
        ShapeError::ConcatMismatch {
            index: 1,
            first_index: 0,
            ..
        },
        "cat",
        ["[2, 3]", "[3, 5]", "dim 0", "2 != 3", "axis 1"]
    );
    assert!(err.to_string().contains("tensor 1"));
    check_err!(
        cat(&[&a, &s([2, 3, 1])], 0),
        ShapeError::ConcatMismatch { .. },
        "cat",
        ["[2, 3]", "[2, 3, 1]", "number of dims"]
    );
    check_err!(cat(&[], 0), ShapeError::Empty { .. }, "cat", ["non-empty"]);
    check_err!(
        cat(&[&Shape::scalar(), &Shape::scalar()], 0),
        ShapeError::RankMismatch { .. },
        "cat",
        ["[]", "at least 1"]
    );
    check_err!(
        cat(&[&a, &b], 2),
        ShapeError::AxisOutOfRange { .. },
        "cat",
        ["[2, 3]", "-2..2"]
    );
    check_err!(
        cat(&[&sym(&[bv, c(3)]), &sym(&[cv, c(3)])], 1),
        ShapeError::ConcatMismatch { .. },
        "cat",
        ["[b, 3]", "[c, 3]", "proven"]
    );
}

#[test]
fn stack_rule() {
    let a = s([2, 3]);
    assert_eq!(stack(&[&a, &a, &a], 0).unwrap(), s([3, 2, 3]));
    assert_eq!(stack(&[&a, &a, &a], 1).unwrap(), s([2, 3, 3]));
    assert_eq!(stack(&[&a, &a, &a], 2).unwrap(), s([2, 3, 3]));
    assert_eq!(stack(&[&a, &a, &a], -1).unwrap(), s([2, 3, 3]));
    assert_eq!(stack(&[&a, &a, &a], -3).unwrap(), s([3, 2, 3]));
    assert_eq!(
        stack(&[&Shape::scalar(), &Shape::scalar()], 0).unwrap(),
        s([2])
    );
    check_err!(
        stack(&[&a, &a], 3),
        ShapeError::AxisOutOfRange { .. },
        "stack",
        ["[2, 3]", "-3..3"]
    );
    check_err!(
        stack(&[&a, &s([2, 4])], 0),
        ShapeError::ConcatMismatch { index: 1, .. },
        "stack",
        ["[2, 3]", "[2, 4]", "dim 1", "3 != 4", "equal shapes"]
    );
    check_err!(
        stack(&[&a, &a, &s([2, 3, 1])], 0),
        ShapeError::ConcatMismatch { index: 2, .. },
        "stack",
        ["[2, 3]", "[2, 3, 1]"]
    );
    check_err!(
        stack(&[], 0),
        ShapeError::Empty { .. },
        "stack",
        ["non-empty"]
    );
}

#[test]
fn split_rule() {
    let sizes = |v: &[i64]| v.iter().map(|&x| c(x)).collect::<Vec<_>>();
    assert_eq!(split(&s([5]), 0, 2).unwrap(), sizes(&[2, 2, 1]));
    assert_eq!(split(&s([6]), 0, 3).unwrap(), sizes(&[3, 3]));
    assert_eq!(split(&s([3]), 0, 5).unwrap(), sizes(&[3]));
    assert_eq!(split(&s([0]), 0, 2).unwrap(), sizes(&[0]));
    assert_eq!(split(&s([0]), 0, 0).unwrap(), sizes(&[0]));
    assert_eq!(split(&s([4, 7]), -1, 3).unwrap(), sizes(&[3, 3, 1]));
    check_err!(
        split(&s([5]), 0, 0),
        ShapeError::InvalidArgument { .. },
        "split",
        ["[5]", "split size 0"]
    );
    let (_, b) = var("b", 1, 64);
    check_err!(
        split(&sym(&[b]), 0, 2),
        ShapeError::InvalidArgument { .. },
        "split",
        ["[b]", "symbolic"]
    );
    check_err!(
        split(&Shape::scalar(), 0, 2),
        ShapeError::AxisOutOfRange { .. },
        "split",
        ["[]"]
    );

    assert_eq!(split_sizes(&s([5, 2]), 0, &[2, 3]).unwrap(), sizes(&[2, 3]));
    assert_eq!(
        split_sizes(&s([5, 2]), 0, &[0, 5, 0]).unwrap(),
        sizes(&[0, 5, 0])
    );
    assert_eq!(
        split_sizes(&sym(&[b + 2]), 0, &[b, c(2)]).unwrap(),
        vec![b, c(2)]
    );
    check_err!(
        split_sizes(&s([5, 2]), 0, &[1, 1]),
        ShapeError::InvalidArgument { .. },
        "split",
        ["[5, 2]", "[1, 1]", "add up to 2"]
    );
    check_err!(
        split_sizes(&s([5, 2]), 0, &[-1, 6]),
        ShapeError::InvalidArgument { .. },
        "split",
        ["[5, 2]", "-1", "negative"]
    );
    check_err!(
        split_sizes(&sym(&[b]), 0, &[2, 3]),
        ShapeError::InvalidArgument { .. },
        "split",
        ["[b]", "proven equal"]
    );
}

#[test]
fn chunk_rule() {
    let sizes = |v: &[i64]| v.iter().map(|&x| c(x)).collect::<Vec<_>>();
    // torch.chunk(torch.arange(5), 3) has sizes [2, 2, 1].
    assert_eq!(chunk(&s([5]), 0, 3).unwrap(), sizes(&[2, 2, 1]));
    // Fewer chunks than asked: torch.chunk(torch.arange(6), 4) has sizes [2, 2, 2].
    assert_eq!(chunk(&s([6]), 0, 4).unwrap(), sizes(&[2, 2, 2]));
    assert_eq!(chunk(&s([6]), 0, 3).unwrap(), sizes(&[2, 2, 2]));
    assert_eq!(chunk(&s([5]), 0, 2).unwrap(), sizes(&[3, 2]));
    assert_eq!(chunk(&s([7]), 0, 4).unwrap(), sizes(&[2, 2, 2, 1]));
    assert_eq!(chunk(&s([1]), 0, 3).unwrap(), sizes(&[1]));
    assert_eq!(chunk(&s([0]), 0, 3).unwrap(), sizes(&[0, 0, 0]));
    assert_eq!(chunk(&s([2, 10]), 1, 3).unwrap(), sizes(&[4, 4, 2]));
    assert_eq!(chunk(&s([5]), 0, 1 << 40).unwrap(), sizes(&[1, 1, 1, 1, 1]));
    check_err!(
        chunk(&s([5]), 0, 0),
        ShapeError::InvalidArgument { .. },
        "chunk",
        ["[5]", "positive"]
    );
    let (_, b) = var("b", 1, 64);
    check_err!(
        chunk(&sym(&[b]), 0, 2),
        ShapeError::InvalidArgument { .. },
        "chunk",
        ["[b]", "symbolic"]
    );
    check_err!(
        chunk(&s([5]), 1, 2),
        ShapeError::AxisOutOfRange { .. },
        "chunk",
        ["[5]"]
    );
}

// === Convolution and pooling ===

/// `torch.nn.Conv*d`'s output size.
fn torch_conv(n: i64, k: i64, s: i64, p: i64, d: i64) -> i64 {
    (n + 2 * p - d * (k - 1) - 1).div_euclid(s) + 1
}

/// torch's `pooling_output_shape`.
fn torch_pool(n: i64, k: i64, s: i64, p: i64, d: i64, ceil: bool) -> i64 {
    let mut out = (n + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 }).div_euclid(s) + 1;
    if ceil && (out - 1) * s >= n + p {
        out -= 1;
    }
    out
}

#[test]
fn conv_out_dim_known_values() {
    // (input, kernel, stride, padding, dilation) -> output, as torch computes them.
    let cases: [(i64, usize, usize, usize, usize, i64); 8] = [
        (32, 3, 2, 1, 1, 16),
        (32, 3, 1, 1, 1, 32),
        (224, 7, 2, 3, 1, 112),
        (28, 5, 1, 0, 1, 24),
        (10, 3, 3, 0, 1, 3),
        (5, 3, 1, 0, 2, 1),
        (7, 3, 2, 2, 2, 4),
        (1, 1, 1, 0, 1, 1),
    ];
    for (n, k, st, p, d, want) in cases {
        let got = conv_out_dim(c(n), k, st, p, d).unwrap();
        assert_eq!(got, Dim::from(want), "conv in={n} k={k} s={st} p={p} d={d}");
        assert_eq!(want, torch_conv(n, k as i64, st as i64, p as i64, d as i64));
    }
    for n in 1..20 {
        for k in 1..5 {
            for st in 1..4 {
                for p in 0..3 {
                    for d in 1..3 {
                        let want = torch_conv(n, k, st, p, d);
                        let got =
                            conv_out_dim(c(n), k as usize, st as usize, p as usize, d as usize);
                        if want >= 1 {
                            assert_eq!(got.unwrap(), c(want));
                        } else {
                            assert!(matches!(got, Err(ShapeError::InvalidArgument { .. })));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn conv_out_dim_errors() {
    check_err!(
        conv_out_dim(c(2), 3, 1, 0, 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[2]", "kernel's extent 3", "would be 0"]
    );
    check_err!(
        conv_out_dim(c(8), 3, 0, 0, 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[8]", "stride 0"]
    );
    check_err!(
        conv_out_dim(c(8), 3, 1, 0, 0),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[8]", "dilation 0"]
    );
    check_err!(
        conv_out_dim(c(8), 0, 1, 0, 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[8]", "kernel size 0"]
    );
    check_err!(
        conv_out_dim(c(8), 3, 1, usize::MAX, 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[8]", "exceeds"]
    );
    check_err!(
        conv_out_dim(c(8), 3, 1, 1 << 62, 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[8]", "overflows"]
    );
}

#[test]
fn pool_out_dim_known_values() {
    let cases: [(i64, usize, usize, usize, usize, bool, i64); 8] = [
        (5, 2, 2, 0, 1, true, 3),
        (5, 2, 2, 0, 1, false, 2),
        (6, 3, 2, 1, 1, true, 4),
        (6, 3, 2, 1, 1, false, 3),
        // The last window would start in the right padding: dropped.
        (5, 2, 2, 1, 1, true, 3),
        (32, 2, 2, 0, 1, false, 16),
        (7, 3, 2, 1, 2, true, 3),
        (112, 3, 2, 1, 1, false, 56),
    ];
    for (n, k, st, p, d, ceil, want) in cases {
        let got = pool_out_dim(c(n), k, st, p, d, ceil).unwrap();
        assert_eq!(
            got,
            c(want),
            "pool in={n} k={k} s={st} p={p} d={d} ceil={ceil}"
        );
        assert_eq!(
            want,
            torch_pool(n, k as i64, st as i64, p as i64, d as i64, ceil)
        );
    }
    for n in 1..20 {
        for k in 1..5 {
            for st in 1..4 {
                for p in 0..=k / 2 {
                    for d in 1..3 {
                        for ceil in [false, true] {
                            let want = torch_pool(n, k, st, p, d, ceil);
                            let got = pool_out_dim(
                                c(n),
                                k as usize,
                                st as usize,
                                p as usize,
                                d as usize,
                                ceil,
                            );
                            if want >= 1 {
                                assert_eq!(
                                    got.unwrap(),
                                    c(want),
                                    "in={n} k={k} s={st} p={p} d={d} {ceil}"
                                );
                            } else {
                                assert!(matches!(got, Err(ShapeError::InvalidArgument { .. })));
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn pool_out_dim_errors() {
    check_err!(
        pool_out_dim(c(8), 3, 1, 2, 1, false),
        ShapeError::InvalidArgument { .. },
        "pool",
        ["[8]", "padding 2", "half the kernel size 3"]
    );
    check_err!(
        pool_out_dim(c(1), 3, 1, 0, 1, true),
        ShapeError::InvalidArgument { .. },
        "pool",
        ["[1]", "would be"]
    );
    check_err!(
        pool_out_dim(c(8), 2, 0, 0, 1, false),
        ShapeError::InvalidArgument { .. },
        "pool",
        ["[8]", "stride 0"]
    );
}

#[test]
fn window_dims_symbolic() {
    let (hv, h) = var("h", 8, 64);
    let conv_out = conv_out_dim(h, 3, 2, 1, 1).unwrap();
    assert!(!conv_out.is_const());
    for ceil in [false, true] {
        let pool_out = pool_out_dim(h, 3, 2, 1, 1, ceil).unwrap();
        for n in 8..=64 {
            let bind = Bindings::new().with(hv, n);
            assert_eq!(conv_out.eval(&bind).unwrap(), torch_conv(n, 3, 2, 1, 1));
            assert_eq!(
                pool_out.eval(&bind).unwrap(),
                torch_pool(n, 3, 2, 1, 1, ceil),
                "{pool_out}"
            );
        }
    }
    // Possibly (not provably) too small: accepted, checked when bound.
    let (_, small) = var("small", 1, 64);
    assert!(conv_out_dim(small, 3, 1, 0, 1).is_ok());
    // Provably too small.
    let (_, tiny) = var("tiny", 1, 2);
    check_err!(
        conv_out_dim(tiny, 5, 1, 0, 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[tiny]"]
    );
}

#[test]
fn conv_rule() {
    let conv2 =
        |i: Shape, w: Shape, st: &[usize], p: &[usize], d: &[usize], g| conv(&i, &w, st, p, d, g);
    assert_eq!(
        conv2(s([8, 3, 32, 32]), s([16, 3, 3, 3]), &[2], &[1], &[], 1).unwrap(),
        s([8, 16, 16, 16])
    );
    assert_eq!(
        conv2(s([8, 3, 32, 32]), s([16, 3, 3, 3]), &[], &[], &[], 1).unwrap(),
        s([8, 16, 30, 30])
    );
    assert_eq!(
        conv2(
            s([1, 3, 32, 20]),
            s([4, 3, 3, 5]),
            &[1, 2],
            &[1, 0],
            &[1, 1],
            1
        )
        .unwrap(),
        s([1, 4, 32, 8])
    );
    // conv1d with groups.
    assert_eq!(
        conv2(s([4, 6, 100]), s([12, 3, 5]), &[1], &[0], &[1], 2).unwrap(),
        s([4, 12, 96])
    );
    // Depthwise.
    assert_eq!(
        conv2(s([2, 8, 10]), s([8, 1, 3]), &[1], &[1], &[1], 8).unwrap(),
        s([2, 8, 10])
    );
    // Unbatched.
    assert_eq!(
        conv2(s([3, 32, 32]), s([16, 3, 3, 3]), &[1], &[0], &[1], 1).unwrap(),
        s([16, 30, 30])
    );
    // conv3d.
    assert_eq!(
        conv2(s([1, 2, 8, 8, 8]), s([4, 2, 3, 3, 3]), &[1], &[1], &[1], 1).unwrap(),
        s([1, 4, 8, 8, 8])
    );
    // Symbolic batch and spatial dims.
    let (hv, h) = var("h", 8, 64);
    let (_, b) = var("b", 1, 64);
    let out = conv(
        &sym(&[b, c(3), h, c(32)]),
        &s([16, 3, 3, 3]),
        &[2],
        &[1],
        &[],
        1,
    )
    .unwrap();
    assert_eq!(out[..2], [b, c(16)]);
    assert_eq!(out[3], c(16));
    assert_eq!(out[2].eval(&Bindings::new().with(hv, 33)).unwrap(), 17);
}

#[test]
fn conv_errors() {
    check_err!(
        conv(&s([1, 4, 32, 32]), &s([64, 3, 3, 3]), &[], &[], &[], 1),
        ShapeError::ConvMismatch { .. },
        "conv",
        [
            "[1, 4, 32, 32]",
            "[64, 3, 3, 3]",
            "groups=1",
            "3 channels",
            "has 4"
        ]
    );
    check_err!(
        conv(&s([1, 6, 32]), &s([5, 3, 3]), &[], &[], &[], 2),
        ShapeError::ConvMismatch { .. },
        "conv",
        ["[1, 6, 32]", "[5, 3, 3]", "divisible by groups=2"]
    );
    check_err!(
        conv(&s([1, 3, 32]), &s([4, 3]), &[], &[], &[], 1),
        ShapeError::RankMismatch { .. },
        "conv",
        ["[4, 3]", "3, 4 or 5"]
    );
    check_err!(
        conv(&s([3, 32]), &s([4, 3, 3, 3]), &[], &[], &[], 1),
        ShapeError::ConvMismatch { .. },
        "conv",
        ["[3, 32]", "[4, 3, 3, 3]", "4-d input"]
    );
    check_err!(
        conv(&s([1, 3, 2, 2]), &s([4, 3, 3, 3]), &[], &[], &[], 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[1, 3, 2, 2]", "dim 2", "extent 3"]
    );
    check_err!(
        conv(&s([1, 3, 8, 8]), &s([4, 3, 3, 3]), &[1, 1, 1], &[], &[], 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[1, 3, 8, 8]", "stride", "expected 1 or 2"]
    );
    check_err!(
        conv(&s([1, 3, 8, 8]), &s([4, 3, 3, 3]), &[], &[], &[], 0),
        ShapeError::ConvMismatch { .. },
        "conv",
        ["[1, 3, 8, 8]", "groups must be positive"]
    );
    check_err!(
        conv(&s([1, 3, 8, 8]), &s([4, 3, 0, 3]), &[], &[], &[], 1),
        ShapeError::InvalidArgument { .. },
        "conv",
        ["[1, 3, 8, 8]", "kernel size 0"]
    );
    let (_, ch) = var("ch", 1, 64);
    check_err!(
        conv(&sym(&[c(1), ch, c(8)]), &s([4, 3, 3]), &[], &[], &[], 1),
        ShapeError::ConvMismatch { .. },
        "conv",
        ["[1, ch, 8]", "proven"]
    );
}

#[test]
fn pool_rule() {
    assert_eq!(
        pool(&s([1, 3, 6, 5]), &[3, 2], &[2], &[1, 0], &[], true).unwrap(),
        s([1, 3, 4, 3])
    );
    assert_eq!(
        pool(&s([3, 8, 8]), &[2, 2], &[], &[], &[], false).unwrap(),
        s([3, 4, 4])
    );
    // The kernel's length sets the spatial rank: a 1-d window over `[3, 8, 8]` keeps two
    // leading dims.
    assert_eq!(
        pool(&s([3, 8, 8]), &[2], &[], &[], &[], false).unwrap(),
        s([3, 8, 4])
    );
    assert_eq!(
        pool(&s([2, 4, 10]), &[3], &[], &[], &[], false).unwrap(),
        s([2, 4, 3])
    );
    assert_eq!(
        pool(&s([2, 4, 10]), &[3], &[], &[], &[], true).unwrap(),
        s([2, 4, 4])
    );
    assert_eq!(
        pool(
            &s([1, 1, 9, 9, 9]),
            &[3, 3, 3],
            &[2, 2, 2],
            &[1],
            &[1],
            false
        )
        .unwrap(),
        s([1, 1, 5, 5, 5])
    );
    check_err!(
        pool(&s([1, 3, 8, 8]), &[], &[], &[], &[], false),
        ShapeError::InvalidArgument { .. },
        "pool",
        ["[1, 3, 8, 8]", "1, 2 or 3"]
    );
    check_err!(
        pool(&s([8, 8]), &[2, 2], &[], &[], &[], false),
        ShapeError::RankMismatch { .. },
        "pool",
        ["[8, 8]", "3 or 4"]
    );
    check_err!(
        pool(&s([1, 3, 8, 8]), &[2, 2], &[], &[2], &[], false),
        ShapeError::InvalidArgument { .. },
        "pool",
        ["[1, 3, 8, 8]", "padding 2", "half the kernel"]
    );
    check_err!(
        pool(&s([1, 3, 1, 8]), &[3, 3], &[], &[], &[], false),
        ShapeError::InvalidArgument { .. },
        "pool",
        ["[1, 3, 1, 8]", "dim 2"]
    );
}
