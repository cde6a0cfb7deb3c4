//! What `RealizeReport` and `stats()` count: a new plan's kernels are compiled, found in a
//! backend's cache of built programs, or interpreted, and each is counted as what it was.
//!
//! In its own binary: dropping every cached plan (through [`set_placement`]) would make
//! other tests' replays plan again.

use tessel_tensor::{DType, Device, Result, Tensor, set_placement, stats};

fn chain(x: &Tensor) -> Result<Tensor> {
    ((x * 2.0)?.exp() - 1.0)?.sum(&[1], false)
}

#[test]
fn programs_from_a_cache_are_not_counted_as_compiled() -> Result<()> {
    let device = Device::default();
    Tensor::manual_seed(5);
    let x = Tensor::randn([16, 33], DType::F32)?.to(&device)?;
    x.realize()?;
    let want = chain(&x)?.to_vec::<f32>()?;

    // A new plan for the same kernels: the backend has their programs already (the CPU's
    // loaded libraries, OpenCL's and wgpu's built programs, CUDA's modules).
    set_placement(&[])?;
    let before = stats();
    let y = chain(&x)?;
    let report = y.realize()?;
    let after = stats();
    eprintln!("{device}: {report:?}");
    assert!(report.kernels >= 1, "{report:?}");
    assert_eq!(
        report.compiled, 0,
        "cached programs counted as compiled: {report:?}"
    );
    assert!(
        report.cached + report.interpreted >= report.kernels,
        "{report:?}"
    );
    assert_eq!(
        after.kernels_prepared() - before.kernels_prepared(),
        report.kernels_prepared() as u64
    );
    assert_eq!(after.kernels_compiled, before.kernels_compiled);
    assert_eq!(y.to_vec::<f32>()?, want);

    // Replaying the plan prepares nothing.
    let again = chain(&x)?.realize()?;
    assert_eq!(
        (again.kernels_prepared(), again.kernels),
        (0, report.kernels)
    );
    Ok(())
}
