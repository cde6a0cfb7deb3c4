//! The kernel tuner end to end, on the device `TESSEL_DEVICE` names: with tuning on (the
//! default level on a GPU, exhaustive elsewhere) a first process searches the launch shapes of a realize's kernels (their variants
//! compiled, checked, timed) and gets the f64 reference's values; a second process with the
//! same cache directory finds every winner in the tuning cache and searches nothing.
//!
//! The test runs itself twice as a child process (the cache directory, `TESSEL_TUNE` and
//! the plan store are read from the environment), so it needs a binary of its own.

use std::process::Command;

use tessel_tensor::{Device, DeviceKind, Result, Tensor, Tuning, tuning};

const ROLE: &str = "TESSEL_TUNING_TEST_ROLE";
const TEST: &str = "tuned_kernels_match_and_a_second_process_tunes_nothing";
const COLS: usize = 1024;

/// Whether the device is a GPU: there the default tuning level applies (other shapes
/// built only when measurement wants them), on kernels of at least 64 MiB; elsewhere the
/// exhaustive level (every shape built first) on small ones.
fn on_gpu() -> bool {
    Device::default()
        .info()
        .is_ok_and(|info| info.kind == DeviceKind::Gpu)
}

/// `tanh(x * y)` and `softmax(x, -1)` over `[rows, COLS]` (96 MiB bound by the first
/// kernel on a GPU) and the transpose `xᵀ - yᵀ` (tiled through local memory among its
/// shapes), realized; returns the report's searched and prepared kernel counts.
fn realize_checked() -> Result<(usize, usize)> {
    let device = Device::default();
    let rows = if on_gpu() { 8192 } else { 64 };
    let data = |seed: u64| -> Vec<f32> {
        let mut s = seed;
        (0..rows * COLS)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
            })
            .collect()
    };
    let (xs, ys) = (data(1), data(2));
    let x = Tensor::from_vec(xs.clone(), [rows, COLS])?.to(&device)?;
    let y = Tensor::from_vec(ys.clone(), [rows, COLS])?.to(&device)?;
    Tensor::realize_all(&[&x, &y])?;
    let product = (&x * &y)?.tanh();
    let softmax = x.softmax(-1)?;
    let transposed = (&x.t()? - &y.t()?)?;
    let report = Tensor::realize_all(&[&product, &softmax, &transposed])?;
    let got_product = product.to_vec::<f32>()?;
    let got_softmax = softmax.to_vec::<f32>()?;
    let got_transposed = transposed.to_vec::<f32>()?;
    for r in 0..rows {
        for c in 0..COLS {
            let want = f64::from(xs[r * COLS + c]) - f64::from(ys[r * COLS + c]);
            let got = f64::from(got_transposed[c * rows + r]);
            assert!(
                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "(xᵀ - yᵀ)[{c}, {r}]: {got} vs {want}"
            );
        }
    }
    for (i, (&a, &b)) in xs.iter().zip(&ys).enumerate() {
        let want = (f64::from(a) * f64::from(b)).tanh();
        let got = f64::from(got_product[i]);
        assert!(
            (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "tanh(x*y)[{i}]: {got} vs {want}"
        );
    }
    for (r, row) in xs.chunks(COLS).enumerate() {
        let max = row
            .iter()
            .map(|&v| f64::from(v))
            .fold(f64::NEG_INFINITY, f64::max);
        let total: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
        for (c, &v) in row.iter().enumerate() {
            let want = (f64::from(v) - max).exp() / total;
            let got = f64::from(got_softmax[r * COLS + c]);
            assert!(
                (got - want).abs() <= 1e-5 * want + 1e-7,
                "softmax[{r}, {c}]: {got} vs {want}"
            );
        }
    }
    eprintln!("{device}: {report:?}");
    Ok((report.tuned, report.kernels_prepared()))
}

/// Where the search process leaves how many programs it prepared, for the reuse process.
fn count_file() -> std::path::PathBuf {
    std::env::var_os("TESSEL_CACHE_DIR")
        .map_or_else(std::env::temp_dir, Into::into)
        .join("tuning-test-prepared")
}

#[test]
fn tuned_kernels_match_and_a_second_process_tunes_nothing() -> Result<()> {
    match std::env::var(ROLE).as_deref() {
        Ok("search") => {
            let level = if on_gpu() {
                Tuning::Default
            } else {
                Tuning::Exhaustive
            };
            assert_eq!(tuning(), level);
            let (tuned, prepared) = realize_checked()?;
            assert!(tuned >= 1, "nothing was tuned");
            std::fs::write(count_file(), prepared.to_string()).expect("writing the count");
            Ok(())
        }
        Ok("reuse") => {
            let (tuned, prepared) = realize_checked()?;
            assert_eq!(tuned, 0, "the tuning cache should know every winner");
            // Each kernel and at most its winner, where the search built every shape it
            // measured.
            let searched: usize = std::fs::read_to_string(count_file())
                .expect("the search process's count")
                .parse()
                .expect("a count");
            assert!(
                prepared <= searched,
                "{prepared} programs prepared, {searched} when searching"
            );
            Ok(())
        }
        _ => {
            let dir =
                std::env::temp_dir().join(format!("tessel-tuning-test-{}", std::process::id()));
            let exe = std::env::current_exe().expect("the test binary's path");
            for role in ["search", "reuse"] {
                let out = Command::new(&exe)
                    .args([TEST, "--exact", "--nocapture"])
                    .env(ROLE, role)
                    .env("TESSEL_CACHE_DIR", &dir)
                    .env("TESSEL_TUNE", if on_gpu() { "1" } else { "2" })
                    .env("TESSEL_PLAN_CACHE", "0")
                    .output()
                    .expect("running the test binary again");
                let stderr = String::from_utf8_lossy(&out.stderr);
                eprintln!("{role}:\n{stderr}");
                assert!(
                    out.status.success(),
                    "the {role} process failed:\n{}\n{stderr}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
            let _ = std::fs::remove_dir_all(&dir);
            Ok(())
        }
    }
}

#[test]
fn tuning_levels_are_settable() {
    let before = tuning();
    tessel_tensor::set_tuning(Tuning::Off);
    assert_eq!(tuning(), Tuning::Off);
    tessel_tensor::set_tuning(before);
}
