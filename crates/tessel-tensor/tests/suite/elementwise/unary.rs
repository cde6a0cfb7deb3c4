//! Unary ops, selection, clamping and conversions (part of the `elementwise` suite).

use super::{Input, b, common, float_result, input, stored, view_input};
use crate::common::{Domain, Layout, Rng};
use tessel_tensor::{DType, Result, Tensor};

// =====================================================================================
// Unary ops
// =====================================================================================

type UnaryFn = fn(&Tensor) -> Result<Tensor>;

/// A unary op under test.
struct Unary {
    name: &'static str,
    run: UnaryFn,
    reference: fn(f64) -> f64,
    /// The result dtype for an input dtype, `None` where the op must fail.
    result: fn(DType) -> Option<DType>,
    domain: Domain,
    transcendental: bool,
}

impl Unary {
    /// An op computed exactly (rounding, sign, tests, wrapping integer ops).
    fn exact(
        name: &'static str,
        run: UnaryFn,
        reference: fn(f64) -> f64,
        result: fn(DType) -> Option<DType>,
    ) -> Unary {
        let domain = Domain::new((-5.0, 5.0), (-20, 20)).quantized(0.25);
        Unary {
            name,
            run,
            reference,
            result,
            domain,
            transcendental: false,
        }
    }

    /// A float function: integer and `bool` inputs give `f32`.
    fn float(name: &'static str, run: UnaryFn, reference: fn(f64) -> f64, domain: Domain) -> Unary {
        Unary {
            name,
            run,
            reference,
            result: |d| Some(float_result(d)),
            domain,
            transcendental: true,
        }
    }
}

fn not_bool(d: DType) -> Option<DType> {
    (d != DType::Bool).then_some(d)
}

const BOOLEAN: fn(DType) -> Option<DType> = |_| Some(DType::Bool);

/// Unary inputs for every dtype: a strided `[7, 3]` view, and values with NaN, the
/// infinities and -0.0 for floats; for `f32` also odd, tiny and 0-d shapes and every view.
fn unary_inputs(rng: &mut Rng, dtype: DType, domain: Domain) -> Vec<(String, Input)> {
    let mut out = vec![(
        "strided".to_owned(),
        view_input(rng, Layout::Strided, dtype, domain, false),
    )];
    if dtype == DType::F32 {
        for dims in [&[45usize, 65][..], &[1, 1], &[7, 13, 3], &[]] {
            out.push((format!("{dims:?}"), input(rng, dtype, dims, domain, false)));
        }
        for layout in Layout::VIEWS {
            out.push((
                format!("{layout:?}"),
                view_input(rng, layout, dtype, domain, false),
            ));
        }
    }
    if dtype.is_float() {
        let mut values = common::random(rng, dtype, 9, domain);
        values[..4].copy_from_slice(&[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0]);
        let t = common::tensor(dtype, &values, &[9]);
        out.push((
            "specials".to_owned(),
            Input {
                t,
                values,
                dims: vec![9],
            },
        ));
    }
    out
}

fn run_unary_table(ops: &[Unary], seed: u64) {
    let mut rng = Rng::new(seed);
    for op in ops {
        for dtype in common::on_device(DType::ALL) {
            for (case, x) in unary_inputs(&mut rng, dtype, op.domain) {
                let what = format!("{} {dtype} {case}", op.name);
                let Some(result) = (op.result)(dtype) else {
                    let check = common::unsupported(op.name, dtype);
                    common::assert_err(&what, (op.run)(&x.t), check, &[op.name, dtype.name()]);
                    continue;
                };
                let out = (op.run)(&x.t).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(
                    (out.dtype(), out.dims()),
                    (result, x.dims.clone()),
                    "{what}"
                );
                // `~` on bool is logical not.
                let flip_bool = op.name == "bitwise_not" && dtype == DType::Bool;
                let reference = |v: f64| {
                    if flip_bool {
                        1.0 - v
                    } else {
                        (op.reference)(v)
                    }
                };
                let want: Vec<f64> = x
                    .values
                    .iter()
                    .map(|&v| stored(result, reference(v)))
                    .collect();
                let rel = common::tolerance(result, op.transcendental);
                // Near zero, composite activations cancel (`1 + tanh(..)` for gelu_tanh at
                // x = -6): errors there are absolute, at torch.testing's f32 atol of 1e-5.
                let floor = if op.transcendental { 0.1 } else { 1e-3 };
                if common::skipped(&out, &what) {
                    continue;
                }
                common::assert_close_floor(&what, &common::read(&out), &want, rel, floor);
            }
        }
    }
}

#[test]
fn unary_math() {
    let wide = Domain::new((-5.0, 5.0), (-5, 5));
    let positive = Domain::new((0.05, 20.0), (0, 20));
    let ops = [
        Unary::float(
            "exp",
            |t| Ok(t.exp()),
            f64::exp,
            Domain::new((-9.0, 9.0), (-9, 9)),
        ),
        Unary::float(
            "exp2",
            |t| Ok(t.exp2()),
            f64::exp2,
            Domain::new((-12.0, 12.0), (-12, 12)),
        ),
        Unary::float("log", |t| Ok(t.log()), f64::ln, positive),
        Unary::float("log2", |t| Ok(t.log2()), f64::log2, positive),
        Unary::float("sqrt", |t| Ok(t.sqrt()), f64::sqrt, positive),
        Unary::float("rsqrt", |t| Ok(t.rsqrt()), |x| 1.0 / x.sqrt(), positive),
        Unary::float("reciprocal", |t| Ok(t.reciprocal()), |x| 1.0 / x, wide),
        Unary::float("sin", |t| Ok(t.sin()), f64::sin, wide),
        Unary::float("cos", |t| Ok(t.cos()), f64::cos, wide),
        Unary::float(
            "tan",
            |t| Ok(t.tan()),
            f64::tan,
            Domain::new((-1.4, 1.4), (-1, 1)),
        ),
        Unary::float("tanh", |t| Ok(t.tanh()), f64::tanh, wide),
        Unary::float("erf", |t| Ok(t.erf()), common::erf, wide),
    ];
    run_unary_table(&ops, 5);
}

fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn gelu_tanh_ref(x: f64) -> f64 {
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

#[test]
fn activations() -> Result<()> {
    let domain = Domain::new((-6.0, 6.0), (-6, 6));
    let relu = |x: f64| if x.is_nan() { x } else { x.max(0.0) };
    let ops = [
        Unary {
            domain,
            ..Unary::exact("relu", |t| Ok(t.relu()), relu, Some)
        },
        Unary::float("sigmoid", |t| Ok(t.sigmoid()), sigmoid_ref, domain),
        Unary::float("silu", |t| Ok(t.silu()), |x| x * sigmoid_ref(x), domain),
        Unary::float(
            "gelu",
            |t| Ok(t.gelu()),
            |x| 0.5 * x * (1.0 + common::erf(x / 2f64.sqrt())),
            domain,
        ),
        Unary::float("gelu_tanh", |t| Ok(t.gelu_tanh()), gelu_tanh_ref, domain),
    ];
    run_unary_table(&ops, 6);
    // Far tails stay finite and accurate: nothing overflows inside sigmoid.
    let s = Tensor::from([-100.0f32, 100.0, -30.0])
        .sigmoid()
        .to_vec::<f32>()?;
    // sigmoid(-100) is subnormal in f32: a device that flushes subnormals gives 0.
    let flushes = tessel_tensor::Device::default()
        .info()?
        .features
        .subnormals_may_flush;
    let tail_ok =
        (f64::from(s[0]) - sigmoid_ref(-100.0)).abs() <= 1.5e-45 || (flushes && s[0] == 0.0);
    assert!(tail_ok && s[1] == 1.0, "{s:?}");
    assert!(
        (f64::from(s[2]) / sigmoid_ref(-30.0) - 1.0).abs() < 1e-5,
        "{s:?}"
    );
    Ok(())
}

#[test]
fn unary_exact() -> Result<()> {
    let sign = |x: f64| if x == 0.0 { 0.0 } else { x.signum() };
    let ops = [
        Unary::exact("neg", Tensor::neg, |x| -x, not_bool),
        Unary::exact("abs", Tensor::abs, f64::abs, not_bool),
        Unary::exact("square", Tensor::square, |x| x * x, not_bool),
        Unary::exact("sign", |t| Ok(t.sign()), sign, Some),
        Unary::exact("floor", Tensor::floor, f64::floor, not_bool),
        Unary::exact("ceil", Tensor::ceil, f64::ceil, not_bool),
        Unary::exact("round", Tensor::round, f64::round_ties_even, not_bool),
        Unary::exact("trunc", Tensor::trunc, f64::trunc, not_bool),
        Unary::exact("isnan", |t| Ok(t.isnan()), |x| b(x.is_nan()), BOOLEAN),
        Unary::exact("isinf", |t| Ok(t.isinf()), |x| b(x.is_infinite()), BOOLEAN),
        Unary::exact(
            "logical_not",
            |t| Ok(t.logical_not()),
            |x| b(x == 0.0),
            BOOLEAN,
        ),
        Unary::exact(
            "bitwise_not",
            Tensor::bitwise_not,
            |x| -x - 1.0,
            |d| (!d.is_float()).then_some(d),
        ),
    ];
    run_unary_table(&ops, 7);
    // Wrapping at the integer minimum, like PyTorch.
    let min = Tensor::from([i8::MIN, -1]);
    assert_eq!(min.neg()?.to_vec::<i8>()?, vec![i8::MIN, 1]);
    assert_eq!(min.abs()?.to_vec::<i8>()?, vec![i8::MIN, 1]);
    Ok(())
}

// =====================================================================================
// Selection and clamping
// =====================================================================================

#[test]
fn where_cond() -> Result<()> {
    let mut rng = Rng::new(8);
    for dtype in common::on_device(DType::ALL) {
        // where(cond [7, 1, 3], x [13, 1], y [3]).
        let cond = input(&mut rng, DType::Bool, &[7, 1, 3], common::DEFAULT, false);
        let x = input(&mut rng, dtype, &[13, 1], common::DEFAULT, true);
        let y = input(&mut rng, dtype, &[3], common::DEFAULT, true);
        let out = Tensor::where_cond(&cond.t, &x.t, &y.t)?;
        let inputs = [
            (&cond.values[..], &cond.dims[..]),
            (&x.values, &x.dims),
            (&y.values, &y.dims),
        ];
        let (want, dims) =
            common::broadcast_map(&inputs, |v| if v[0] == 0.0 { v[2] } else { v[1] });
        assert_eq!((out.dtype(), out.dims()), (dtype, dims), "where {dtype}");
        common::assert_close(&format!("where {dtype}"), &common::read(&out), &want, 0.0);
        // where(cond view, x view, number): the number promotes like a binary op's.
        let cond = view_input(
            &mut rng,
            Layout::Flipped,
            DType::Bool,
            common::DEFAULT,
            false,
        );
        let x = view_input(&mut rng, Layout::Permuted, dtype, common::DEFAULT, false);
        let out = Tensor::where_cond(&cond.t, &x.t, 2.5)?;
        let promoted = dtype.promote_scalar(DType::F32.kind());
        assert_eq!(out.dtype(), promoted);
        let pick = |(&c, &v): (&f64, &f64)| {
            if c == 0.0 {
                common::round_to(promoted, 2.5)
            } else {
                v
            }
        };
        let want: Vec<f64> = cond.values.iter().zip(&x.values).map(pick).collect();
        common::assert_close(
            &format!("where {dtype} view, 2.5"),
            &common::read(&out),
            &want,
            0.0,
        );
    }
    // Two numbers: the highest category's default dtype.
    let cond = Tensor::from([true, false]);
    assert_eq!(
        Tensor::where_cond(&cond, 1.0, 0)?.to_vec::<f32>()?,
        vec![1.0, 0.0]
    );
    assert_eq!(
        Tensor::where_cond(&cond, 1, 0)?.to_vec::<i64>()?,
        vec![1, 0]
    );
    assert_eq!(
        Tensor::where_cond(&cond, false, true)?.to_vec::<bool>()?,
        vec![false, true]
    );
    // Errors name the op, the operands and the fix.
    let bad = Tensor::from([1.0f32, 0.0]);
    let res = Tensor::where_cond(&bad, &bad, 0.0);
    common::assert_err(
        "where f32 cond",
        res,
        common::invalid("where"),
        &["bool", "f32", "ne(0)"],
    );
    let res = Tensor::where_cond(&Tensor::from([[true, false, true]]), &bad, 0.0);
    common::assert_err(
        "where [1, 3] [2]",
        res,
        common::shape_error,
        &["where", "[1, 3]", "[2]"],
    );
    Ok(())
}

fn clamp_ref(v: f64, lo: f64, hi: f64) -> f64 {
    if v.is_nan() { v } else { v.max(lo).min(hi) }
}

#[test]
fn clamp() -> Result<()> {
    let mut rng = Rng::new(10);
    for dtype in common::on_device(DType::ALL) {
        let x = input(&mut rng, dtype, &[5, 9], common::DEFAULT, true);
        // Integer bounds keep the dtype (bool becomes i64); float bounds give f32 on
        // integers. Bounds convert to the result dtype.
        let (lo, hi) = if dtype == DType::Bool {
            (0, 0)
        } else {
            (-2, 3)
        };
        let out = x.t.clamp(Some(lo), Some(hi))?;
        let promoted = dtype.promote_scalar(DType::I64.kind());
        let (lo, hi) = (
            common::round_to(promoted, lo as f64),
            common::round_to(promoted, hi as f64),
        );
        let want: Vec<f64> = x.values.iter().map(|&v| clamp_ref(v, lo, hi)).collect();
        assert_eq!(out.dtype(), promoted);
        common::assert_close(&format!("clamp {dtype}"), &common::read(&out), &want, 0.0);
        let out = x.t.clamp(Some(-1.5), None)?;
        let promoted = dtype.promote_scalar(DType::F32.kind());
        let lo = common::round_to(promoted, -1.5);
        let want: Vec<f64> = x
            .values
            .iter()
            .map(|&v| clamp_ref(v, lo, f64::INFINITY))
            .collect();
        assert_eq!(out.dtype(), promoted);
        common::assert_close(
            &format!("clamp min {dtype}"),
            &common::read(&out),
            &want,
            0.0,
        );
    }
    // min > max gives max.
    let out = Tensor::from([0.0f32, 5.0]).clamp(Some(3.0), Some(1.0))?;
    assert_eq!(out.to_vec::<f32>()?, vec![1.0, 1.0]);
    // Tensor bounds broadcast, and views feed every operand.
    let x = view_input(
        &mut rng,
        Layout::Narrowed,
        DType::F32,
        common::DEFAULT,
        true,
    );
    let lo = input(
        &mut rng,
        DType::F32,
        &[3],
        Domain::new((-3.0, 0.0), (0, 0)),
        false,
    );
    let hi = view_input(
        &mut rng,
        Layout::Expanded,
        DType::F32,
        Domain::new((0.0, 3.0), (0, 0)),
        false,
    );
    let out = x.t.clamp_tensor(Some(&lo.t), Some(&hi.t))?;
    let inputs = [
        (&x.values[..], &x.dims[..]),
        (&lo.values, &lo.dims),
        (&hi.values, &hi.dims),
    ];
    let (want, _) = common::broadcast_map(&inputs, |v| clamp_ref(v[0], v[1], v[2]));
    common::assert_close("clamp_tensor", &common::read(&out), &want, 0.0);
    let out = x.t.clamp_tensor(None, Some(&lo.t))?;
    let (want, _) =
        common::broadcast_map(&inputs[..2], |v| clamp_ref(v[0], f64::NEG_INFINITY, v[1]));
    common::assert_close("clamp_tensor max only", &common::read(&out), &want, 0.0);
    // No bounds at all is an error.
    let res = x.t.clamp(None::<f64>, None);
    common::assert_err("clamp()", res, common::invalid("clamp"), &["min", "max"]);
    let res = x.t.clamp_tensor(None, None);
    common::assert_err(
        "clamp_tensor()",
        res,
        common::invalid("clamp"),
        &["min", "max"],
    );
    Ok(())
}

// =====================================================================================
// Conversions
// =====================================================================================

/// The bits of `x` stored as `dtype`.
fn bits_of(dtype: DType, x: f64) -> u64 {
    match dtype {
        DType::F16 => u64::from(tessel_tensor::f16::from_f64(x).to_bits()),
        DType::BF16 => u64::from(tessel_tensor::bf16::from_f64(x).to_bits()),
        DType::F32 => u64::from((x as f32).to_bits()),
        DType::F64 => x.to_bits(),
        _ => (x as i128 as u64) & (u64::MAX >> (64 - dtype.bits())),
    }
}

/// The value of `bits` read as `dtype`.
fn from_bits(dtype: DType, bits: u64) -> f64 {
    match dtype {
        DType::F16 => tessel_tensor::f16::from_bits(bits as u16).to_f64(),
        DType::BF16 => tessel_tensor::bf16::from_bits(bits as u16).to_f64(),
        DType::F32 => f64::from(f32::from_bits(bits as u32)),
        DType::F64 => f64::from_bits(bits),
        DType::I8 => f64::from(bits as u8 as i8),
        DType::I16 => f64::from(bits as u16 as i16),
        DType::I32 => f64::from(bits as u32 as i32),
        DType::I64 => bits as i64 as f64,
        _ => bits as f64,
    }
}

#[test]
fn cast_and_bitcast() -> Result<()> {
    let mut rng = Rng::new(9);
    let domain = Domain::new((-300.0, 300.0), (-300, 300)).quantized(0.125);
    for from in common::on_device(DType::ALL) {
        // Fractions, negatives, values past every integer range, and the float specials.
        let mut x = input(&mut rng, from, &[5, 7], domain, false);
        if from.is_float() {
            let special = [
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                -0.0,
                1e10,
                -1e10,
                65_519.0,
                2.5,
                -2.5,
            ];
            for (v, s) in x.values.iter_mut().zip(special) {
                *v = common::round_to(from, s);
            }
            x.t = common::tensor(from, &x.values, &x.dims);
        }
        // Casts read a transposed view.
        let view = x.t.permute(&[1, 0])?;
        let logical: Vec<f64> = (0..35).map(|k| x.values[(k % 5) * 7 + k / 5]).collect();
        for to in common::on_device(DType::ALL) {
            let what = format!("cast {from} -> {to}");
            let out = view.cast(to);
            assert_eq!((out.dtype(), out.dims()), (to, vec![7, 5]), "{what}");
            let saturates = from.is_float() && to.is_int();
            let convert = |&v: &f64| {
                if saturates {
                    common::saturate_to(to, v)
                } else {
                    common::round_to(to, v)
                }
            };
            let want: Vec<f64> = logical.iter().map(convert).collect();
            common::assert_close(&what, &common::read(&out), &want, 0.0);

            let what = format!("bitcast {from} -> {to}");
            let res = x.t.bitcast(to);
            if from.size_bytes() != to.size_bytes() || (to == DType::Bool && from != to) {
                common::assert_err(
                    &what,
                    res,
                    common::invalid("bitcast"),
                    &[from.name(), to.name()],
                );
                continue;
            }
            let out = res?;
            assert_eq!(out.dtype(), to, "{what}");
            let want: Vec<f64> = x
                .values
                .iter()
                .map(|&v| from_bits(to, bits_of(from, v)))
                .collect();
            common::assert_close(&what, &common::read(&out), &want, 0.0);
        }
    }
    Ok(())
}
