//! Creation ops: constants, ranges, identity matrices, random tensors and Rust arrays,
//! against plain-Rust references.

use crate::common;
use crate::common::{Domain, Layout, Rng};
use tessel_tensor::{DType, Error, Result, Tensor, bf16, f16};

#[test]
fn constants_and_likes() -> Result<()> {
    let mut rng = Rng::new(11);
    for dtype in common::on_device(DType::ALL) {
        for dims in [&[2usize, 3][..], &[45, 65], &[1], &[7, 13, 3], &[]] {
            let what = format!("{dtype} {dims:?}");
            let n: usize = dims.iter().product();
            let zeros = Tensor::zeros(dims, dtype);
            let ones = Tensor::ones(dims, dtype);
            let full = Tensor::full(dims, -3.75, dtype);
            for (name, t, want) in [
                ("zeros", &zeros, 0.0),
                ("ones", &ones, 1.0),
                ("full", &full, common::saturate_to(dtype, -3.75)),
            ] {
                assert_eq!(
                    (t.dtype(), t.dims()),
                    (dtype, dims.to_vec()),
                    "{name} {what}"
                );
                assert_eq!(common::read(t), vec![want; n], "{name} {what}");
            }
        }
        // The *_like ops keep the shape, dtype and device of any input, views included.
        let x = common::view(
            Layout::Permuted,
            dtype,
            &common::random(&mut rng, dtype, 21, common::DEFAULT),
            7,
            3,
            0.0,
        )
        .0;
        for (name, t, want) in [
            ("zeros_like", x.zeros_like(), 0.0),
            ("ones_like", x.ones_like(), 1.0),
            (
                "full_like",
                x.full_like(2.5f32),
                common::saturate_to(dtype, 2.5),
            ),
        ] {
            assert_eq!(
                (t.dtype(), t.dims(), t.device()),
                (dtype, vec![7, 3], x.device()),
                "{name} {dtype}"
            );
            assert_eq!(common::read(&t), vec![want; 21], "{name} {dtype}");
        }
    }
    // Values convert like Scalar::cast: exact for wide integers, wrapping, from half types.
    assert_eq!(
        Tensor::full([2], u64::MAX, DType::U64).to_vec::<u64>()?,
        vec![u64::MAX; 2]
    );
    assert_eq!(
        Tensor::full([2], 300i32, DType::U8).to_vec::<u8>()?,
        vec![44; 2]
    );
    assert_eq!(
        Tensor::full([1], f16::from_f32(1.5), DType::F32).to_vec::<f32>()?,
        vec![1.5]
    );
    assert_eq!(
        Tensor::full([1], f64::NAN, DType::Bool).to_vec::<bool>()?,
        vec![true]
    );
    Ok(())
}

/// PyTorch's `arange` in `f64`: `ceil((end - start) / step)` values `start + i * step`.
fn arange_ref(start: f64, end: f64, step: f64) -> Vec<f64> {
    let n = ((end - start) / step).ceil().max(0.0) as usize;
    (0..n).map(|i| start + i as f64 * step).collect()
}

#[test]
fn ranges() -> Result<()> {
    // All-integer arguments give i64, exactly.
    for (start, end, step) in [
        (0i64, 10i64, 1i64),
        (3, -7, -2),
        (-4, 17, 5),
        (0, 1, 3),
        (-1_000_000, 1_000_000, 7),
    ] {
        let t = Tensor::arange(start, end, step)?;
        let want = arange_ref(start as f64, end as f64, step as f64);
        assert_eq!(t.dtype(), DType::I64);
        assert_eq!(common::read(&t), want, "arange({start}, {end}, {step})");
    }
    assert_eq!(
        Tensor::arange(2i32, 11i32, 3i32)?.to_vec::<i64>()?,
        vec![2, 5, 8]
    );
    // Any float argument gives f32.
    for (start, end, step) in [
        (0.0, 1.0, 0.1),
        (1.0, 2.5, 0.5),
        (-3.0, 3.0, 0.7),
        (10.0, -10.0, -1.5),
        (0.0, 100_000.0, 1.0),
        (0.5, 0.6, 1.0),
    ] {
        let t = Tensor::arange(start, end, step)?;
        assert_eq!(t.dtype(), DType::F32);
        let want = arange_ref(start, end, step);
        common::assert_close(
            &format!("arange({start}, {end}, {step})"),
            &common::read(&t),
            &want,
            1e-5,
        );
    }
    let mixed = Tensor::arange(1, 2.5, 0.5f32)?;
    assert_eq!(
        (mixed.dtype(), mixed.to_vec::<f32>()?),
        (DType::F32, vec![1.0, 1.5, 2.0])
    );
    // Bad ranges fail at the call, naming the op and the values.
    let bad = [
        (Tensor::arange(0, 5, 0), "nonzero"),
        (Tensor::arange(0.0, 5.0, 0.0), "nonzero"),
        (Tensor::arange(0, 5, -1), "positive"),
        (Tensor::arange(5.0, 0.0, 0.5), "negative"),
        (Tensor::arange(0.0, f64::INFINITY, 1.0), "finite"),
        (Tensor::arange(f64::NAN, 1.0, 1.0), "finite"),
        (Tensor::arange(0.0, 1e300, 1e-300), "too long"),
        (Tensor::arange(i64::MIN, i64::MAX, 1), "too long"),
    ];
    for (i, (res, why)) in bad.into_iter().enumerate() {
        common::assert_err(
            &format!("bad arange #{i}"),
            res,
            |e| matches!(e, Error::InvalidArgument { op: "arange", .. }),
            &["arange", why],
        );
    }

    // linspace: PyTorch's two-sided formula; both ends exact.
    for (start, end, steps) in [
        (0.0, 1.0, 5usize),
        (-1.0, 1.0, 7),
        (3.0, 9.0, 1),
        (5.0, -5.0, 11),
        (0.0, 1.0, 1000),
        (-2.5, 7.25, 2),
    ] {
        let t = Tensor::linspace(start, end, steps);
        let got = common::read(&t);
        assert_eq!((t.dtype(), t.dims()), (DType::F32, vec![steps]));
        let step = if steps > 1 {
            (end - start) / (steps - 1) as f64
        } else {
            0.0
        };
        let want: Vec<f64> = (0..steps)
            .map(|i| {
                if i < steps / 2 || steps == 1 {
                    start + step * i as f64
                } else {
                    end - step * (steps - 1 - i) as f64
                }
            })
            .collect();
        let what = format!("linspace({start}, {end}, {steps})");
        common::assert_close_floor(&what, &got, &want, 1e-5, start.abs().max(end.abs()));
        assert_eq!(got[0], start, "{what}");
        if steps > 1 {
            assert_eq!(got[steps - 1], end, "{what}");
        }
    }

    // eye: ones on the main diagonal, for square and both kinds of rectangle.
    for (n, m) in [(3, 3), (1, 1), (2, 5), (5, 2), (45, 65)] {
        let t = if n == m {
            Tensor::eye(n)
        } else {
            Tensor::eye_m(n, m)
        };
        assert_eq!((t.dtype(), t.dims()), (DType::F32, vec![n, m]));
        let want: Vec<f64> = (0..n * m)
            .map(|k| if k / m == k % m { 1.0 } else { 0.0 })
            .collect();
        assert_eq!(common::read(&t), want, "eye({n}, {m})");
    }
    Ok(())
}

/// Mean, variance and the fraction of values below `cut`.
fn moments(values: &[f64], cut: f64) -> (f64, f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let below = values.iter().filter(|&&v| v < cut).count() as f64 / n;
    (mean, var, below)
}

#[test]
fn random() -> Result<()> {
    // The only test in this file that draws, so the sequence is the seed's alone.
    const N: usize = 20_000;
    Tensor::manual_seed(1234);
    let sigma = |v: f64| 5.0 * (v / N as f64).sqrt();
    for dtype in common::on_device(DType::ALL) {
        if !dtype.is_float() {
            for res in [Tensor::rand([3], dtype), Tensor::randn([3], dtype)] {
                common::assert_err(
                    &format!("rand {dtype}"),
                    res,
                    |e| matches!(e, Error::UnsupportedDType { dtype: d, .. } if *d == dtype),
                    &[dtype.name(), "float"],
                );
            }
            continue;
        }
        let u = Tensor::rand([N / 100, 100], dtype)?;
        assert_eq!((u.dtype(), u.dims()), (dtype, vec![N / 100, 100]));
        let values = common::read(&u);
        assert!(
            values.iter().all(|v| (0.0..1.0).contains(v)),
            "rand {dtype} outside [0, 1)"
        );
        // Uniform: mean 1/2, variance 1/12, a quarter below 1/4.
        let (mean, var, below) = moments(&values, 0.25);
        assert!(
            (mean - 0.5).abs() < sigma(1.0 / 12.0),
            "rand {dtype} mean {mean}"
        );
        assert!(
            (var - 1.0 / 12.0).abs() < 0.01,
            "rand {dtype} variance {var}"
        );
        assert!(
            (below - 0.25).abs() < sigma(0.25 * 0.75),
            "rand {dtype} P(x < 1/4) = {below}"
        );
        // Standard normal: mean 0, variance 1, 84.13% below 1.
        let z = Tensor::randn([N + 1], dtype)?;
        let (mean, var, below) = moments(&common::read(&z), 1.0);
        assert!(mean.abs() < sigma(1.0), "randn {dtype} mean {mean}");
        assert!(
            (var - 1.0).abs() < sigma(2.0) + 0.01,
            "randn {dtype} variance {var}"
        );
        assert!(
            (below - 0.841_345).abs() < sigma(0.84 * 0.16),
            "randn {dtype} P(z < 1) = {below}"
        );
    }
    // A shape no host could fill is an error naming the op, never a panic or an empty
    // tensor (its element count overflowed before).
    for res in [
        Tensor::randn([1usize << 62, 4], DType::F32),
        Tensor::rand([usize::MAX, 2], DType::F16),
    ] {
        common::assert_err(
            "random of an impossible size",
            res,
            |e| matches!(e, Error::InvalidArgument { .. }),
            &["host"],
        );
    }
    // Sizes past what any memory holds read back as errors, never as empty data.
    for (what, t) in [
        (
            "zeros [usize::MAX]",
            Tensor::zeros([usize::MAX], DType::F32),
        ),
        (
            "zeros [2^40, 2^40]",
            Tensor::zeros([1usize << 40, 1 << 40], DType::F32),
        ),
    ] {
        assert!(t.to_vec::<f32>().is_err(), "{what}");
    }
    // Half types: exact multiples of 2^-p, never rounded up to 1.
    let h = common::read(&Tensor::rand([4096], DType::F16)?);
    assert!(h.iter().all(|v| (v * 2048.0).fract() == 0.0 && *v < 1.0));
    let h = common::read(&Tensor::rand([4096], DType::BF16)?);
    assert!(h.iter().all(|v| (v * 256.0).fract() == 0.0 && *v < 1.0));
    // A seed fixes the sequence; successive draws differ.
    Tensor::manual_seed(7);
    let a = Tensor::rand([2, 5], DType::F32)?.to_vec::<f32>()?;
    let b = Tensor::randn([2, 5], DType::F64)?.to_vec::<f64>()?;
    let c = Tensor::rand([2, 5], DType::F32)?.to_vec::<f32>()?;
    assert_ne!(a, c);
    Tensor::manual_seed(7);
    assert_eq!(Tensor::rand([2, 5], DType::F32)?.to_vec::<f32>()?, a);
    assert_eq!(Tensor::randn([2, 5], DType::F64)?.to_vec::<f64>()?, b);
    // Any shape, 0-d and empty included.
    assert_eq!(Tensor::rand([], DType::F32)?.numel(), 1);
    assert_eq!(
        Tensor::randn([0, 3], DType::F32)?.to_vec::<f32>()?,
        Vec::<f32>::new()
    );
    philox_values_and_dropout()
}

/// Philox4x32-10 (Salmon et al. 2011), written out here from the paper, independently of
/// the library: word `word` of counter `(i, stream)` under key `seed`.
fn philox(seed: u64, stream: u64, i: u64, word: usize) -> u32 {
    let mut c = [
        i as u32,
        (i >> 32) as u32,
        stream as u32,
        (stream >> 32) as u32,
    ];
    let mut k = [seed as u32, (seed >> 32) as u32];
    for round in 0..10 {
        if round > 0 {
            k = [
                k[0].wrapping_add(0x9E37_79B9),
                k[1].wrapping_add(0xBB67_AE85),
            ];
        }
        let p0 = 0xD251_1F53u64 * u64::from(c[0]);
        let p1 = 0xCD9E_8D57u64 * u64::from(c[2]);
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c[word]
}

/// Word `base + step (i mod group)` of the block at counter `i / group`: the layouts the
/// random ops document.
fn word(seed: u64, stream: u64, i: u64, (group, step, base): (u64, u64, u64)) -> u32 {
    philox(
        seed,
        stream,
        i / group,
        (base + step * (i % group)) as usize,
    )
}

/// The documented values: each draw is the next stream after `manual_seed`, and element
/// `i` is a fixed function of its Philox words, on every backend (rand exactly).
fn philox_values_and_dropout() -> Result<()> {
    const SEED: u64 = 0x0123_4567_89ab_cdef;
    let u24 = |w: u32| f64::from(w >> 8) / 16_777_216.0;
    Tensor::manual_seed(SEED);
    // Stream 0: f32 uniforms, the top 24 bits of word i mod 4 of block i / 4.
    let got = common::read(&Tensor::rand([3, 37], DType::F32)?);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(
            *g,
            u24(word(SEED, 0, i as u64, (4, 1, 0))),
            "rand f32 at {i}"
        );
    }
    // Stream 1: bf16 uniforms, the top 8 bits.
    let got = common::read(&Tensor::rand([300], DType::BF16)?);
    for (i, g) in got.iter().enumerate() {
        let want = f64::from(word(SEED, 1, i as u64, (4, 1, 0)) >> 24) / 256.0;
        assert_eq!(*g, want, "rand bf16 at {i}");
    }
    // Stream 2: normals by Box-Muller in pairs: positions 2p and 2p + 1 (row-major, over
    // any shape) take r cos θ and r sin θ from words 2 (p mod 2) and 2 (p mod 2) + 1 of
    // block p / 2.
    let got = common::read(&Tensor::randn([7, 143], DType::F32)?);
    for (i, g) in got.iter().enumerate() {
        let p = i as u64 / 2;
        let (u1, u2) = (
            u24(word(SEED, 2, p, (2, 2, 0))),
            u24(word(SEED, 2, p, (2, 2, 1))),
        );
        let (r, theta) = ((-2.0 * (1.0 - u1).ln()).sqrt(), std::f64::consts::TAU * u2);
        let want = if i % 2 == 0 {
            r * theta.cos()
        } else {
            r * theta.sin()
        };
        assert!(
            (g - want).abs() <= 1e-4 * want.abs().max(1.0),
            "randn f32 at {i}: {g} vs {want}"
        );
    }
    if common::on_device([DType::F64]).len() == 1 {
        // Stream 3: f64 uniforms from 27 + 26 bits of the same two words.
        let got = common::read(&Tensor::rand([500], DType::F64)?);
        for (i, g) in got.iter().enumerate() {
            let i = i as u64;
            let (a, b) = (
                word(SEED, 3, i, (2, 2, 0)) >> 5,
                word(SEED, 3, i, (2, 2, 1)) >> 6,
            );
            let want = (f64::from(a) * 67_108_864.0 + f64::from(b)) / 9_007_199_254_740_992.0;
            assert_eq!(*g, want, "rand f64 at {i}");
        }
    }
    // Dropout: kept where the word is at least round(p 2^32), scaled by 1 / (1 - p) in
    // the dtype.
    Tensor::manual_seed(SEED);
    let mut rng = Rng::new(5);
    let values = common::random(&mut rng, DType::F32, 4096, common::DEFAULT);
    let x = common::tensor(DType::F32, &values, &[64, 64]);
    x.realize()?;
    let threshold = (0.3f64 * 4_294_967_296.0).round() as u32;
    let scale = (1.0 / 0.7f64) as f32;
    for (draw, stream) in [(0, 0u64), (1, 1)] {
        let y = x.dropout(0.3)?;
        let report = y.realize()?;
        if draw == 1 {
            // A new draw is a new key for the same plan: nothing is prepared again.
            assert_eq!(
                report.kernels_prepared(),
                0,
                "second dropout draw: {report:?}"
            );
        }
        let got = common::read(&y);
        let mut kept = 0;
        for (i, (g, v)) in got.iter().zip(&values).enumerate() {
            let want = if word(SEED, stream, i as u64, (4, 1, 0)) >= threshold {
                kept += 1;
                f64::from(*v as f32 * scale)
            } else {
                0.0
            };
            assert_eq!(*g, want, "dropout draw {draw} at {i}");
        }
        assert!(
            (kept as f64 / 4096.0 - 0.7).abs() < 0.05,
            "kept {kept} of 4096"
        );
    }
    // Its gradient is the same mask, scaled.
    Tensor::manual_seed(SEED);
    let g = tessel_tensor::grad(&x.dropout(0.3)?.sum_all()?, &[&x])?.remove(0);
    for (i, g) in common::read(&g).iter().enumerate() {
        let want = if word(SEED, 0, i as u64, (4, 1, 0)) >= threshold {
            f64::from(scale)
        } else {
            0.0
        };
        assert_eq!(*g, want, "dropout gradient at {i}");
    }
    for p in [-0.1, 1.5, f64::NAN] {
        common::assert_err(
            &format!("dropout p = {p}"),
            x.dropout(p),
            |e| matches!(e, Error::InvalidArgument { op: "dropout", .. }),
            &["[0, 1]"],
        );
    }
    Ok(())
}

#[test]
fn from_arrays_and_scalars() -> Result<()> {
    let t = Tensor::from([1u8, 2, 3]);
    assert_eq!(
        (t.dtype(), t.dims(), t.to_vec::<u8>()?),
        (DType::U8, vec![3], vec![1, 2, 3])
    );
    let t = Tensor::from([[1.5f32, 2.0, -3.0], [4.0, 5.0, 6.5]]);
    assert_eq!(
        (t.dims(), t.to_vec::<f32>()?),
        (vec![2, 3], vec![1.5, 2.0, -3.0, 4.0, 5.0, 6.5])
    );
    let t = Tensor::from([[[true, false]], [[false, true]], [[true, true]]]);
    assert_eq!(
        (t.dims(), t.to_vec::<bool>()?),
        (vec![3, 1, 2], vec![true, false, false, true, true, true])
    );
    let t = Tensor::from([[[1i64, -2], [3, -4]], [[5, -6], [7, i64::MIN]]]);
    assert_eq!(
        (t.dtype(), t.dims(), t.to_vec::<i64>()?),
        (
            DType::I64,
            vec![2, 2, 2],
            vec![1, -2, 3, -4, 5, -6, 7, i64::MIN]
        )
    );
    let t = Tensor::from([f16::from_f32(0.5), f16::from_f32(-2.0)]);
    assert_eq!(
        (t.dtype(), t.to_vec::<f16>()?),
        (DType::F16, vec![f16::from_f32(0.5), f16::from_f32(-2.0)])
    );
    let t = Tensor::from([[bf16::from_f32(1.0)], [bf16::from_f32(3.0)]]);
    assert_eq!((t.dtype(), t.dims()), (DType::BF16, vec![2, 1]));
    assert_eq!(
        Tensor::from([u16::MAX, 0]).to_vec::<u16>()?,
        vec![u16::MAX, 0]
    );
    assert_eq!(Tensor::from([u32::MAX]).to_vec::<u32>()?, vec![u32::MAX]);
    assert_eq!(Tensor::from([u64::MAX]).to_vec::<u64>()?, vec![u64::MAX]);
    assert_eq!(
        Tensor::from([i8::MIN, i8::MAX]).to_vec::<i8>()?,
        vec![i8::MIN, i8::MAX]
    );
    assert_eq!(Tensor::from([i16::MIN]).to_vec::<i16>()?, vec![i16::MIN]);
    assert_eq!(Tensor::from([i32::MAX]).to_vec::<i32>()?, vec![i32::MAX]);
    assert_eq!(Tensor::from([0.1f64]).to_vec::<f64>()?, vec![0.1]);
    let empty = Tensor::from([0f32; 0]);
    assert_eq!((empty.dims(), empty.to_vec::<f32>()?), (vec![0], vec![]));
    // 0-d scalars of every kind, usable with item() and in ops.
    let s = Tensor::scalar(2.5f32);
    assert_eq!((s.ndim(), s.numel(), s.item::<f32>()?), (0, 1, 2.5));
    assert_eq!(Tensor::scalar(-7i16).item::<i16>()?, -7);
    assert!(Tensor::scalar(true).item::<bool>()?);
    assert_eq!(Tensor::scalar(u64::MAX).item::<u64>()?, u64::MAX);
    let sum = Tensor::from([1.0f32, 2.0]).add(&s)?;
    assert_eq!(sum.to_vec::<f32>()?, vec![3.5, 4.5]);
    Ok(())
}

#[test]
fn creation_ops_compose_with_views() -> Result<()> {
    // Index-based constants broadcast against data and views.
    let mut rng = Rng::new(12);
    let values = common::random(&mut rng, DType::F32, 21, Domain::new((-1.0, 1.0), (0, 0)));
    let (x, logical) = common::view(Layout::Flipped, DType::F32, &values, 7, 3, 0.0);
    let out = x.add(&Tensor::arange(0, 3, 1)?)?.mul(Tensor::eye_m(7, 3))?;
    let want: Vec<f64> = (0..21)
        .map(|k| {
            if k / 3 == k % 3 {
                logical[k] + (k % 3) as f64
            } else {
                0.0
            }
        })
        .collect();
    common::assert_close("(x + arange) * eye", &common::read(&out), &want, 1e-6);
    Ok(())
}
