//! Math functions missing from the core unary set (`expm1`, `log1p`, inverse and
//! hyperbolic trigonometry, `atan2`, `hypot`) and activations built on them, all composed
//! from existing elementwise ops so that every backend runs them and they fuse.
//!
//! Accuracy comes from the formulas, not from extra precision: `expm1` and `log1p` use
//! Kahan's and Goldberg's corrections, `atan` a range reduction plus Cephes' minimax
//! approximations, and the hyperbolic functions switch to cancellation-free forms near 0.
//! Integer and `bool` inputs compute in `f32`, `f16`/`bf16` compute in `f32` and round
//! once, like PyTorch.

use tessel_graph::Op;
use tessel_shape::{BinaryOp, DType, UnaryOp};

use super::Operand;
use crate::tensor::Tensor;
use tessel_runtime::{Error, Result};

const LN_2: f64 = std::f64::consts::LN_2;
const FRAC_PI_2: f64 = std::f64::consts::FRAC_PI_2;
const FRAC_PI_4: f64 = std::f64::consts::FRAC_PI_4;
const PI: f64 = std::f64::consts::PI;
/// Above this magnitude `x^2` terms of `asinh`/`acosh` would overflow `f32`, while
/// `log(2|x|)` is already exact to far below the tolerance.
const HUGE: f64 = 268_435_456.0; // 2^28

// Short names for the composition steps; operands are already aligned floats.
fn bin(a: &Tensor, op: BinaryOp, b: &Tensor) -> Tensor {
    a.raw_binary(op, b)
}
fn add(a: &Tensor, b: &Tensor) -> Tensor {
    bin(a, BinaryOp::Add, b)
}
fn sub(a: &Tensor, b: &Tensor) -> Tensor {
    bin(a, BinaryOp::Sub, b)
}
fn mul(a: &Tensor, b: &Tensor) -> Tensor {
    bin(a, BinaryOp::Mul, b)
}
fn div(a: &Tensor, b: &Tensor) -> Tensor {
    bin(a, BinaryOp::Div, b)
}
fn addc(a: &Tensor, c: f64) -> Tensor {
    add(a, &a.constant(c))
}
fn mulc(a: &Tensor, c: f64) -> Tensor {
    mul(a, &a.constant(c))
}
fn un(a: &Tensor, op: UnaryOp) -> Tensor {
    a.raw_unary(op)
}
fn cmpc(a: &Tensor, op: BinaryOp, c: f64) -> Tensor {
    bin(a, op, &a.constant(c))
}
fn pick(cond: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
    cond.raw_where(a, b)
}

/// Whether the sign bit is set, read from the bits so `-0.0` and negative NaNs count.
fn signbit(x: &Tensor) -> Tensor {
    let int = if x.dtype() == DType::F64 {
        DType::I64
    } else {
        DType::I32
    };
    let bits = x.record(Op::Bitcast(x.node()), int, x.shape().clone());
    cmpc(&bits, BinaryOp::Lt, 0.0)
}

/// `magnitude` (non-negative or NaN) with the sign of `sign`.
fn with_sign_of(magnitude: &Tensor, sign: &Tensor) -> Tensor {
    pick(&signbit(sign), &un(magnitude, UnaryOp::Neg), magnitude)
}

/// Kahan's `expm1`: `u = e^x`; `x` where `u == 1`, `-1` where `u - 1 == -1`, else
/// `(u - 1) x / log u`, whose rounding errors cancel.
fn expm1_of(x: &Tensor) -> Tensor {
    let u = un(x, UnaryOp::Exp);
    let um1 = addc(&u, -1.0);
    let general = div(&mul(&um1, x), &un(&u, UnaryOp::Log));
    // inf / inf would be NaN; e^x overflowed, so the answer is u itself.
    let general = pick(&un(&u, UnaryOp::IsInf), &u, &general);
    let general = pick(&cmpc(&um1, BinaryOp::Eq, -1.0), &um1, &general);
    let general = pick(&cmpc(&u, BinaryOp::Eq, 1.0), x, &general);
    if x.dtype() == DType::F64 {
        return general;
    }
    // The quotient needs a log accurate relative to its (tiny) result near 1, which f32
    // devices need not give (WGSL's log bound is absolute there: NVIDIA's Vulkan driver
    // was 0.7% off at x = -3e-6). Below |x| = 0.5 the Taylor series to x^9/9! is within
    // 1.1e-8 relative: x (1 + x/2 (1 + x/3 (... (1 + x/9)))).
    let mut p = x.constant(1.0);
    for k in (2..=9).rev() {
        p = addc(&mul(&mulc(x, 1.0 / f64::from(k)), &p), 1.0);
    }
    let small = cmpc(&un(x, UnaryOp::Abs), BinaryOp::Lt, 0.5);
    pick(&small, &mul(x, &p), &general)
}

/// Goldberg's `log1p`: `u = 1 + x`; `x` where `u == 1`, else `log(u) x / (u - 1)`.
fn log1p_of(x: &Tensor) -> Tensor {
    let u = addc(x, 1.0);
    let general = div(&mul(&un(&u, UnaryOp::Log), x), &addc(&u, -1.0));
    // log(inf) * inf / inf would be NaN; -inf must stay NaN (below the domain).
    let general = pick(&cmpc(&u, BinaryOp::Eq, f64::INFINITY), &u, &general);
    let general = pick(&cmpc(&u, BinaryOp::Eq, 1.0), x, &general);
    if x.dtype() == DType::F64 {
        return general;
    }
    // As in `expm1_of`, f32 devices' log near 1 is not accurate enough relative to a tiny
    // result. For -0.3 < x < 0.4, log1p(x) = 2 atanh(s), s = x / (2 + x), |s| < 0.18: the
    // odd series to s^11/11 is within 1e-9 relative.
    let s = div(x, &addc(x, 2.0));
    let z = mul(&s, &s);
    let series = mulc(
        &mul(
            &s,
            &horner(
                &z,
                &[1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0],
            ),
        ),
        2.0,
    );
    let small = cmpc(&un(&addc(x, -0.05), UnaryOp::Abs), BinaryOp::Lt, 0.35);
    pick(&small, &series, &general)
}

/// Horner's rule for `sum coeffs[i] z^(n-i)`.
fn horner(z: &Tensor, coeffs: &[f64]) -> Tensor {
    let mut acc = z.constant(coeffs[0]);
    for &c in &coeffs[1..] {
        acc = addc(&mul(&acc, z), c);
    }
    acc
}

/// `atan` of a non-negative (or NaN, or `+inf`) `a`: Cephes' range reduction to
/// `|t| <= tan(pi/8)` (`f32`) or `0.66` (`f64`), then its minimax approximation.
fn atan_nonneg(a: &Tensor) -> Tensor {
    let f64_path = a.dtype() == DType::F64;
    let (lo, hi) = if f64_path {
        (0.66, 2.414_213_562_373_095)
    } else {
        (0.414_213_562_373_095, 2.414_213_562_373_095)
    };
    let big = cmpc(a, BinaryOp::Gt, hi);
    let mid = cmpc(a, BinaryOp::Gt, lo);
    // -1/a for a > tan(3pi/8) (atan a = pi/2 + atan(-1/a)); (a-1)/(a+1) in the middle.
    let t = pick(
        &big,
        &un(&un(a, UnaryOp::Reciprocal), UnaryOp::Neg),
        &pick(&mid, &div(&addc(a, -1.0), &addc(a, 1.0)), a),
    );
    let base = pick(
        &big,
        &a.constant(FRAC_PI_2),
        &pick(&mid, &a.constant(FRAC_PI_4), &a.constant(0.0)),
    );
    let z = mul(&t, &t);
    let poly = if f64_path {
        let p = horner(
            &z,
            &[
                -8.750_608_600_031_904e-1,
                -1.615_753_718_733_365e1,
                -7.500_855_792_314_705e1,
                -1.228_866_684_490_136e2,
                -6.485_021_904_942_025e1,
            ],
        );
        let q = horner(
            &z,
            &[
                1.0,
                2.485_846_490_142_306e1,
                1.650_270_098_316_988e2,
                4.328_810_604_912_903e2,
                4.853_903_996_359_137e2,
                1.945_506_571_482_614e2,
            ],
        );
        div(&mul(&z, &p), &q)
    } else {
        mul(
            &z,
            &horner(
                &z,
                &[
                    8.053_744_495_38e-2,
                    -1.387_768_560_32e-1,
                    1.997_771_064_78e-1,
                    -3.333_294_915_39e-1,
                ],
            ),
        )
    };
    let r = add(&mul(&t, &poly), &t);
    // Cephes adds back the low bits of pi/2 and pi/4 lost in the f64 constants.
    let r = if f64_path {
        let more = 6.123_233_995_736_766e-17;
        let extra = pick(
            &big,
            &a.constant(more),
            &pick(&mid, &a.constant(0.5 * more), &a.constant(0.0)),
        );
        add(&r, &extra)
    } else {
        r
    };
    add(&base, &r)
}

/// `atan2(y, x)` with C's special cases, for aligned float `y` and `x`.
fn atan2_of(y: &Tensor, x: &Tensor) -> Tensor {
    let one = x.constant(1.0);
    // Both infinite: the angle is that of (±1, ±1). Both zero: that of (±0, ±1).
    let both_inf = bin(
        &un(y, UnaryOp::IsInf),
        BinaryOp::And,
        &un(x, UnaryOp::IsInf),
    );
    let zero = x.constant(0.0);
    let both_zero = bin(
        &bin(y, BinaryOp::Eq, &zero),
        BinaryOp::And,
        &bin(x, BinaryOp::Eq, &zero),
    );
    let ay = pick(&both_inf, &one, &un(y, UnaryOp::Abs));
    let ax = pick(
        &bin(&both_inf, BinaryOp::Or, &both_zero),
        &one,
        &un(x, UnaryOp::Abs),
    );
    let t = atan_nonneg(&div(&ay, &ax));
    let angle = pick(&signbit(x), &sub(&x.constant(PI), &t), &t);
    with_sign_of(&angle, y)
}

impl Tensor {
    /// Runs `f` on `self` as a float: integers and `bool` in `f32`, `f16`/`bf16` in `f32`
    /// rounded once at the end.
    fn math_opmath(&self, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        let x = self.to_float();
        if matches!(x.dtype(), DType::F16 | DType::BF16) {
            f(&x.cast_to(DType::F32)).cast_to(x.dtype())
        } else {
            f(&x)
        }
    }

    /// `self` and `other` promoted, broadcast and made float, for a binary math op.
    fn math_binary(
        &self,
        other: impl Operand,
        name: &'static str,
        f: impl FnOnce(&Tensor, &Tensor) -> Tensor,
    ) -> Result<Tensor> {
        let (a, b) = self.align_operand(other, name)?;
        let (a, b) = (a.to_float(), b.to_float());
        let half = a.dtype();
        Ok(if matches!(half, DType::F16 | DType::BF16) {
            f(&a.cast_to(DType::F32), &b.cast_to(DType::F32)).cast_to(half)
        } else {
            f(&a, &b)
        })
    }

    /// `e^x - 1` (`torch.expm1`), accurate for tiny `|x|` where `exp(x) - 1` cancels.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([1e-10f32]).expm1().item::<f32>()?;
    /// assert!((y - 1e-10).abs() < 1e-15);
    /// # Ok(())
    /// # }
    /// ```
    pub fn expm1(&self) -> Tensor {
        self.math_opmath(expm1_of)
    }

    /// `log(1 + x)` (`torch.log1p`), accurate for tiny `|x|`; NaN below -1, `-inf` at -1.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([1e-10f64]).log1p().item::<f64>()?;
    /// assert!((y - 1e-10f64.ln_1p()).abs() < 1e-24); // log(1 + 1e-10) would be off by 1e-17
    /// # Ok(())
    /// # }
    /// ```
    pub fn log1p(&self) -> Tensor {
        self.math_opmath(log1p_of)
    }

    /// The base-10 logarithm (`torch.log10`).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([100.0f32]).log10().item::<f32>()?;
    /// assert!((y - 2.0).abs() < 1e-6);
    /// # Ok(())
    /// # }
    /// ```
    pub fn log10(&self) -> Tensor {
        self.math_opmath(|x| mulc(&un(x, UnaryOp::Log), std::f64::consts::LOG10_E))
    }

    /// The complementary error function `1 - erf(x)` (`torch.erfc`). In `f32` (and the
    /// halves) `|x| >= 0.5` uses the Chebyshev fit `t e^(-x^2 + P(t))`, `t = 1/(1 + |x|/2)`
    /// (relative error ~1.2e-7), so the tail keeps its digits down to underflow; `f64` is
    /// `1 - erf(x)`, accurate in absolute terms only (the tail beyond x ~ 6 is lost).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([0.0f32, 5.0]).erfc().to_vec::<f32>()?;
    /// assert_eq!(y[0], 1.0);
    /// assert!((y[1] / 1.537_459_8e-12 - 1.0).abs() < 1e-5);
    /// # Ok(())
    /// # }
    /// ```
    pub fn erfc(&self) -> Tensor {
        self.math_opmath(|x| {
            let direct = sub(&x.constant(1.0), &un(x, UnaryOp::Erf));
            if x.dtype() == DType::F64 {
                return direct;
            }
            let a = un(x, UnaryOp::Abs);
            let t = un(&addc(&mulc(&a, 0.5), 1.0), UnaryOp::Reciprocal);
            // Numerical Recipes' erfcc coefficients, highest power first.
            let p = horner(
                &t,
                &[
                    0.170_872_77,
                    -0.822_152_23,
                    1.488_515_87,
                    -1.135_203_98,
                    0.278_868_07,
                    -0.186_288_06,
                    0.096_784_18,
                    0.374_091_96,
                    1.000_023_68,
                    -1.265_512_23,
                ],
            );
            let tail = mul(&t, &un(&sub(&p, &mul(&a, &a)), UnaryOp::Exp));
            // erfc(-a) = 2 - erfc(a).
            let tail = pick(
                &cmpc(x, BinaryOp::Lt, 0.0),
                &sub(&x.constant(2.0), &tail),
                &tail,
            );
            pick(&cmpc(&a, BinaryOp::Lt, 0.5), &direct, &tail)
        })
    }

    /// The hyperbolic sine (`torch.sinh`), through `expm1` near 0 so tiny `x` keep their
    /// digits, and through `e^(|x| - ln 2)` elsewhere so it overflows only where `sinh`
    /// does.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([1.0f64]).sinh().item::<f64>()?;
    /// assert!((y - 1f64.sinh()).abs() < 1e-15);
    /// # Ok(())
    /// # }
    /// ```
    pub fn sinh(&self) -> Tensor {
        self.math_opmath(|x| {
            let a = un(x, UnaryOp::Abs);
            // sinh a = (u + u / (u + 1)) / 2 with u = e^a - 1: no cancellation.
            let u = expm1_of(&a);
            let small = mulc(&add(&u, &div(&u, &addc(&u, 1.0))), 0.5);
            // h = e^a / 2 and e^-a / 2 = 1 / (4h).
            let h = un(&addc(&a, -LN_2), UnaryOp::Exp);
            let large = sub(&h, &div(&h.constant(0.25), &h));
            let s = pick(&cmpc(&a, BinaryOp::Lt, 1.0), &small, &large);
            with_sign_of(&s, x)
        })
    }

    /// The hyperbolic cosine (`torch.cosh`), overflowing only where `cosh` does.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// assert_eq!(Tensor::from([0.0f32]).cosh().item::<f32>()?, 1.0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn cosh(&self) -> Tensor {
        self.math_opmath(|x| {
            let h = un(&addc(&un(x, UnaryOp::Abs), -LN_2), UnaryOp::Exp);
            add(&h, &div(&h.constant(0.25), &h))
        })
    }

    /// The inverse hyperbolic sine (`torch.asinh`):
    /// `sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))`, and `log(2|x|)` for huge `|x|`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([1.0f64]).asinh().item::<f64>()?;
    /// assert!((y - 1f64.asinh()).abs() < 1e-15);
    /// # Ok(())
    /// # }
    /// ```
    pub fn asinh(&self) -> Tensor {
        self.math_opmath(|x| {
            let a = un(x, UnaryOp::Abs);
            // x^2 / (1 + sqrt(1 + x^2)) = a / (1/a + sqrt(1 + 1/a^2)), which stays finite.
            let r = un(&a, UnaryOp::Reciprocal);
            let tail = div(&a, &add(&r, &un(&addc(&mul(&r, &r), 1.0), UnaryOp::Sqrt)));
            let near = log1p_of(&add(&a, &tail));
            let far = addc(&un(&a, UnaryOp::Log), LN_2);
            let v = pick(&cmpc(&a, BinaryOp::Gt, HUGE), &far, &near);
            with_sign_of(&v, x)
        })
    }

    /// The inverse hyperbolic cosine (`torch.acosh`): `log1p(t + sqrt(t (t + 2)))` with
    /// `t = x - 1`, accurate near 1; NaN below 1.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// assert_eq!(Tensor::from([1.0f32]).acosh().item::<f32>()?, 0.0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn acosh(&self) -> Tensor {
        self.math_opmath(|x| {
            let t = addc(x, -1.0);
            let near = log1p_of(&add(&t, &un(&mul(&t, &addc(&t, 2.0)), UnaryOp::Sqrt)));
            let far = addc(&un(x, UnaryOp::Log), LN_2);
            pick(&cmpc(x, BinaryOp::Gt, HUGE), &far, &near)
        })
    }

    /// The inverse hyperbolic tangent (`torch.atanh`): `sign(x) log1p(2|x| / (1 - |x|)) / 2`;
    /// `±inf` at `±1`, NaN beyond.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// assert_eq!(Tensor::from([1.0f32]).atanh().item::<f32>()?, f32::INFINITY);
    /// # Ok(())
    /// # }
    /// ```
    pub fn atanh(&self) -> Tensor {
        self.math_opmath(|x| {
            let a = un(x, UnaryOp::Abs);
            let q = div(&mulc(&a, 2.0), &sub(&a.constant(1.0), &a));
            with_sign_of(&mulc(&log1p_of(&q), 0.5), x)
        })
    }

    /// The inverse tangent (`torch.atan`), in `[-pi/2, pi/2]`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([1.0f64]).atan().item::<f64>()?;
    /// assert!((y - std::f64::consts::FRAC_PI_4).abs() < 1e-15);
    /// # Ok(())
    /// # }
    /// ```
    pub fn atan(&self) -> Tensor {
        self.math_opmath(|x| with_sign_of(&atan_nonneg(&un(x, UnaryOp::Abs)), x))
    }

    /// The inverse sine (`torch.asin`) as `atan2(x, sqrt((1 - x)(1 + x)))`, exact at
    /// `±1`; NaN outside `[-1, 1]`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([1.0f32]).asin().item::<f32>()?;
    /// assert_eq!(y, std::f32::consts::FRAC_PI_2);
    /// # Ok(())
    /// # }
    /// ```
    pub fn asin(&self) -> Tensor {
        self.math_opmath(|x| {
            let c = un(
                &mul(&sub(&x.constant(1.0), x), &addc(x, 1.0)),
                UnaryOp::Sqrt,
            );
            atan2_of(x, &c)
        })
    }

    /// The inverse cosine (`torch.acos`) as `atan2(sqrt((1 - x)(1 + x)), x)`, in
    /// `[0, pi]`; NaN outside `[-1, 1]`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([-1.0f64]).acos().item::<f64>()?;
    /// assert_eq!(y, std::f64::consts::PI);
    /// # Ok(())
    /// # }
    /// ```
    pub fn acos(&self) -> Tensor {
        self.math_opmath(|x| {
            let s = un(
                &mul(&sub(&x.constant(1.0), x), &addc(x, 1.0)),
                UnaryOp::Sqrt,
            );
            atan2_of(&s, x)
        })
    }

    /// The angle of the point `(other, self)` (`torch.atan2(self, other)`), in
    /// `[-pi, pi]`, with C's results for zeros of either sign and infinities. Broadcasts;
    /// integers compute in `f32`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([1.0f32, 0.0]);
    /// let a = y.atan2(-1.0)?.to_vec::<f32>()?;
    /// assert!((a[0] - 3.0 * std::f32::consts::FRAC_PI_4).abs() < 1e-6);
    /// assert_eq!(a[1], std::f32::consts::PI);
    /// # Ok(())
    /// # }
    /// ```
    pub fn atan2(&self, other: impl Operand) -> Result<Tensor> {
        self.math_binary(other, "atan2", atan2_of)
    }

    /// `sqrt(self^2 + other^2)` (`torch.hypot`) without intermediate overflow or
    /// underflow; `inf` if either is infinite, even with a NaN.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let h = Tensor::from([3e30f32]).hypot(4e30)?.item::<f32>()?;
    /// assert!((h / 5e30 - 1.0).abs() < 1e-6);
    /// # Ok(())
    /// # }
    /// ```
    pub fn hypot(&self, other: impl Operand) -> Result<Tensor> {
        self.math_binary(other, "hypot", |a, b| {
            let (a, b) = (un(a, UnaryOp::Abs), un(b, UnaryOp::Abs));
            let hi = bin(&a, BinaryOp::Max, &b);
            let lo = bin(&a, BinaryOp::Min, &b);
            let r = div(&lo, &hi);
            let h = mul(&hi, &un(&addc(&mul(&r, &r), 1.0), UnaryOp::Sqrt));
            let h = pick(&cmpc(&hi, BinaryOp::Eq, 0.0), &hi, &h);
            let any_inf = bin(
                &un(&a, UnaryOp::IsInf),
                BinaryOp::Or,
                &un(&b, UnaryOp::IsInf),
            );
            pick(&any_inf, &a.constant(f64::INFINITY), &h)
        })
    }

    /// `log(1 + e^(beta x)) / beta`, or `x` where `beta x > threshold`
    /// (`torch.nn.functional.softplus`; PyTorch's defaults are `beta = 1`,
    /// `threshold = 20`). Fails if `beta` is 0.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([0.0f32, 30.0]).softplus(1.0, 20.0)?.to_vec::<f32>()?;
    /// assert!((y[0] - 2f32.ln()).abs() < 1e-6 && y[1] == 30.0);
    /// assert!(Tensor::from([1.0f32]).softplus(0.0, 20.0).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn softplus(&self, beta: f64, threshold: f64) -> Result<Tensor> {
        if beta == 0.0 || beta.is_nan() {
            return Err(Error::InvalidArgument {
                op: "softplus",
                reason: format!(
                    "beta must be a non-zero number, got {beta}; use beta = 1.0 for the standard softplus"
                ),
            });
        }
        Ok(self.math_opmath(|x| {
            let bx = mulc(x, beta);
            let soft = mulc(&log1p_of(&un(&bx, UnaryOp::Exp)), 1.0 / beta);
            pick(&cmpc(&bx, BinaryOp::Gt, threshold), x, &soft)
        }))
    }

    /// `x` for `x > 0`, else `alpha (e^x - 1)` (`torch.nn.functional.elu`).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([2.0f32, -1e-10]).elu(1.0).to_vec::<f32>()?;
    /// assert_eq!(y[0], 2.0);
    /// assert!((y[1] + 1e-10).abs() < 1e-15);
    /// # Ok(())
    /// # }
    /// ```
    pub fn elu(&self, alpha: f64) -> Tensor {
        self.math_opmath(|x| elu_of(x, alpha, 1.0))
    }

    /// `scale * elu(x, alpha)` with SELU's constants (`torch.nn.functional.selu`).
    pub fn selu(&self) -> Tensor {
        const ALPHA: f64 = 1.673_263_242_354_377_3;
        const SCALE: f64 = 1.050_700_987_355_480_5;
        self.math_opmath(|x| mulc(&elu_of(x, ALPHA, 1.0), SCALE))
    }

    /// `max(0, x) + min(0, alpha (e^(x/alpha) - 1))` (`torch.nn.functional.celu`). Fails
    /// if `alpha` is 0.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// assert_eq!(Tensor::from([3.0f32]).celu(2.0)?.item::<f32>()?, 3.0);
    /// assert!(Tensor::from([3.0f32]).celu(0.0).is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub fn celu(&self, alpha: f64) -> Result<Tensor> {
        if alpha == 0.0 || alpha.is_nan() {
            return Err(Error::InvalidArgument {
                op: "celu",
                reason: format!(
                    "alpha must be a non-zero number, got {alpha}; use alpha = 1.0 for the default"
                ),
            });
        }
        Ok(self.math_opmath(|x| elu_of(x, alpha, 1.0 / alpha)))
    }

    /// `x` for `x > 0`, else `negative_slope * x` (`torch.nn.functional.leaky_relu`;
    /// PyTorch's default slope is `0.01`).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([-2.0f32, 3.0]).leaky_relu(0.5).to_vec::<f32>()?;
    /// assert_eq!(y, vec![-1.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn leaky_relu(&self, negative_slope: f64) -> Tensor {
        self.math_opmath(|x| pick(&cmpc(x, BinaryOp::Gt, 0.0), x, &mulc(x, negative_slope)))
    }

    /// `x / (1 + |x|)` (`torch.nn.functional.softsign`).
    pub fn softsign(&self) -> Tensor {
        self.math_opmath(|x| div(x, &addc(&un(x, UnaryOp::Abs), 1.0)))
    }

    /// `log(sigmoid(x)) = min(x, 0) - log1p(e^-|x|)` (`torch.nn.functional.logsigmoid`),
    /// finite for every finite `x`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// assert_eq!(Tensor::from([-200.0f32]).logsigmoid().item::<f32>()?, -200.0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn logsigmoid(&self) -> Tensor {
        self.math_opmath(|x| {
            let e = un(&un(&un(x, UnaryOp::Abs), UnaryOp::Neg), UnaryOp::Exp);
            sub(&bin(x, BinaryOp::Min, &x.constant(0.0)), &log1p_of(&e))
        })
    }

    /// `relu6(x + 3) / 6` (`torch.nn.functional.hardsigmoid`).
    pub fn hardsigmoid(&self) -> Tensor {
        self.math_opmath(hardsigmoid_of)
    }

    /// `x * relu6(x + 3) / 6` (`torch.nn.functional.hardswish`).
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([-4.0f32, 1.0, 4.0]).hardswish().to_vec::<f32>()?;
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 4.0 / 6.0).abs() < 1e-6);
    /// assert_eq!(y[2], 4.0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn hardswish(&self) -> Tensor {
        self.math_opmath(|x| mul(x, &hardsigmoid_of(x)))
    }

    /// `x * tanh(softplus(x))` (`torch.nn.functional.mish`).
    pub fn mish(&self) -> Tensor {
        self.math_opmath(|x| {
            let sp = pick(
                &cmpc(x, BinaryOp::Gt, 20.0),
                x,
                &log1p_of(&un(x, UnaryOp::Exp)),
            );
            mul(x, &un(&sp, UnaryOp::Tanh))
        })
    }

    /// `|self|` with the sign bit of `other` (`torch.copysign`), `-0.0` and negative NaNs
    /// included. Broadcasts; integers compute in `f32`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([2.0f32, 3.0]).copysign(&Tensor::from([-0.0f32, 1.0]))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![-2.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn copysign(&self, other: impl Operand) -> Result<Tensor> {
        self.math_binary(other, "copysign", |a, b| {
            with_sign_of(&un(a, UnaryOp::Abs), b)
        })
    }

    /// `log(e^self + e^other)` (`torch.logaddexp`) without overflow:
    /// `max + log1p(e^-|self - other|)`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([1000.0f32]).logaddexp(1000.0)?.item::<f32>()?;
    /// assert!((y - (1000.0 + std::f32::consts::LN_2)).abs() < 1e-3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn logaddexp(&self, other: impl Operand) -> Result<Tensor> {
        self.math_binary(other, "logaddexp", |a, b| {
            let hi = bin(a, BinaryOp::Max, b);
            let e = un(
                &un(&un(&sub(a, b), UnaryOp::Abs), UnaryOp::Neg),
                UnaryOp::Exp,
            );
            let general = add(&hi, &log1p_of(&e));
            // Equal infinities make a - b NaN; their sum's log is a + ln 2 (still ±inf).
            pick(&bin(a, BinaryOp::Eq, b), &addc(a, LN_2), &general)
        })
    }

    /// Replaces NaN with `nan`, `+inf` with `posinf` and `-inf` with `neginf`
    /// (`torch.nan_to_num`); `None` means the dtype's largest (or lowest) finite value.
    /// Integers and `bool` are returned unchanged.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let t = Tensor::from([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.0]);
    /// let y = t.nan_to_num(0.0, Some(9.0), None).to_vec::<f32>()?;
    /// assert_eq!(y, vec![0.0, 9.0, f32::MIN, 1.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn nan_to_num(&self, nan: f64, posinf: Option<f64>, neginf: Option<f64>) -> Tensor {
        let max = match self.dtype() {
            // Computed in f32 with float8's own largest values, then rounded back (exact
            // unless `nan` itself is not a float8 value).
            d @ (DType::F8E4M3 | DType::F8E5M2) => {
                let max = d.max_value().to_f64();
                return self
                    .cast_to(DType::F32)
                    .nan_to_num(
                        nan,
                        Some(posinf.unwrap_or(max)),
                        Some(neginf.unwrap_or(-max)),
                    )
                    .cast_to(d);
            }
            DType::F16 => 65504.0,
            DType::BF16 => 3.389_531_389_251_535_5e38,
            DType::F32 => f64::from(f32::MAX),
            DType::F64 => f64::MAX,
            _ => return self.clone(),
        };
        let x = self;
        let inf = un(x, UnaryOp::IsInf);
        let pos = bin(&inf, BinaryOp::And, &cmpc(x, BinaryOp::Gt, 0.0));
        let y = pick(&un(x, UnaryOp::IsNan), &x.constant(nan), x);
        let y = pick(&pos, &x.constant(posinf.unwrap_or(max)), &y);
        let neg = bin(&inf, BinaryOp::And, &cmpc(x, BinaryOp::Lt, 0.0));
        pick(&neg, &x.constant(neginf.unwrap_or(-max)), &y)
    }

    /// Whether `|self - other| <= atol + rtol |other|` elementwise (`torch.isclose`), as
    /// `bool`; infinities are close only to themselves, NaNs only with `equal_nan`.
    /// PyTorch's defaults are `rtol = 1e-5`, `atol = 1e-8`. Fails for negative tolerances.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let a = Tensor::from([1.0f32, f32::NAN, f32::INFINITY]);
    /// let b = Tensor::from([1.000_001f32, f32::NAN, f32::INFINITY]);
    /// let c = a.isclose(&b, 1e-5, 1e-8, true)?.to_vec::<bool>()?;
    /// assert_eq!(c, vec![true, true, true]);
    /// assert!(!a.allclose(&b, 1e-5, 1e-8, false)?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn isclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> Result<Tensor> {
        const OP: &str = "isclose";
        if rtol.is_nan() || atol.is_nan() || rtol < 0.0 || atol < 0.0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: format!(
                    "rtol and atol must be non-negative, got rtol = {rtol}, atol = {atol}; the defaults are 1e-5 and 1e-8"
                ),
            });
        }
        let (a, b) = self.align(other, OP)?;
        // Integers compare their difference in f64 (exact for |values| < 2^53), and so
        // does float8 (exact, and it has no arithmetic of its own).
        let (a, b) = if a.dtype().is_float() && !a.dtype().is_float8() {
            (a, b)
        } else {
            (a.cast_to(DType::F64), b.cast_to(DType::F64))
        };
        let equal = bin(&a, BinaryOp::Eq, &b);
        let finite = |t: &Tensor| {
            bin(
                &un(&un(t, UnaryOp::IsInf), UnaryOp::Not),
                BinaryOp::And,
                &un(&un(t, UnaryOp::IsNan), UnaryOp::Not),
            )
        };
        let both_finite = bin(&finite(&a), BinaryOp::And, &finite(&b));
        let diff = un(&sub(&a, &b), UnaryOp::Abs);
        let tol = addc(&mulc(&un(&b, UnaryOp::Abs), rtol), atol);
        let within = bin(&both_finite, BinaryOp::And, &bin(&diff, BinaryOp::Le, &tol));
        let mut close = bin(&equal, BinaryOp::Or, &within);
        if equal_nan {
            let nans = bin(
                &un(&a, UnaryOp::IsNan),
                BinaryOp::And,
                &un(&b, UnaryOp::IsNan),
            );
            close = bin(&close, BinaryOp::Or, &nans);
        }
        Ok(close)
    }

    /// Whether every element is [`Tensor::isclose`] (`torch.allclose`); realizes the
    /// comparison to answer.
    pub fn allclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> Result<bool> {
        self.isclose(other, rtol, atol, equal_nan)?
            .all_all()?
            .item::<bool>()
    }

    /// `self + weight (end - self)` (`torch.lerp`), computed from `end` for `weight >= 0.5`
    /// so `weight = 1` gives `end` exactly. Broadcasts; integers compute in `f32`.
    ///
    /// ```
    /// # use tessel_tensor::Tensor;
    /// # fn main() -> tessel_tensor::Result<()> {
    /// let y = Tensor::from([0.0f32, 10.0]).lerp(&Tensor::from([10.0f32, 20.0]), 0.25)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![2.5, 12.5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn lerp(&self, end: &Tensor, weight: f64) -> Result<Tensor> {
        // A float weight keeps self's float dtype, like a Python scalar in PyTorch.
        let w = self.to_float().constant(weight);
        self.lerp_tensor(end, &w)
    }

    /// [`Tensor::lerp`] with a tensor of weights, broadcast with `self` and `end`.
    pub fn lerp_tensor(&self, end: &Tensor, weight: &Tensor) -> Result<Tensor> {
        const OP: &str = "lerp";
        let (start, end) = self.align(end, OP)?;
        let (start, w) = start.align(weight, OP)?;
        let (end, w) = end.align(&w, OP)?;
        let (start, w) = start.align(&w, OP)?;
        let dtype = start.dtype();
        let half = matches!(dtype, DType::F16 | DType::BF16);
        let f = |t: &Tensor| {
            let t = t.to_float();
            if half { t.cast_to(DType::F32) } else { t }
        };
        let (s, e, w) = (f(&start), f(&end), f(&w));
        let d = sub(&e, &s);
        let lo = add(&s, &mul(&w, &d));
        let hi = sub(&e, &mul(&d, &sub(&w.constant(1.0), &w)));
        let out = pick(&cmpc(&w, BinaryOp::Lt, 0.5), &lo, &hi);
        Ok(if half { out.cast_to(dtype) } else { out })
    }

    /// `x * sigmoid(1.702 x)`, the GELU approximation of CLIP (`quick_gelu`).
    pub fn quick_gelu(&self) -> Tensor {
        self.math_opmath(|x| mul(x, &mulc(x, 1.702).sigmoid()))
    }
}

/// `x` for `x > 0`, else `alpha (e^(k x) - 1)` (ELU with `k = 1`, CELU with `k = 1/alpha`).
fn elu_of(x: &Tensor, alpha: f64, k: f64) -> Tensor {
    let neg = mulc(&expm1_of(&mulc(x, k)), alpha);
    pick(&cmpc(x, BinaryOp::Gt, 0.0), x, &neg)
}

/// `clamp(x / 6 + 1/2, 0, 1)`, NaN staying NaN.
fn hardsigmoid_of(x: &Tensor) -> Tensor {
    let y = addc(&mulc(x, 1.0 / 6.0), 0.5);
    let y = bin(&y, BinaryOp::Max, &x.constant(0.0));
    bin(&y, BinaryOp::Min, &x.constant(1.0))
}
