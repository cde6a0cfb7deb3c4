//! The devices the runtime found, printed for `cargo xtask test-gpu`, which reads the
//! `tessel-device:` lines to learn which backends this machine has.

use tessel_tensor::{Device, Tensor};

#[test]
fn lists_devices_and_runs_on_the_default_one() -> tessel_tensor::Result<()> {
    let all = Device::all();
    assert_eq!(
        all.first(),
        Some(&Device::cpu()),
        "the CPU is always listed first"
    );
    for device in &all {
        let info = device.info()?;
        assert!(!info.name.is_empty(), "{device} has no name");
        assert!(info.max_workgroup_size > 0, "{device}: {info:?}");
        eprintln!("tessel-device: {device} {}", info.name);
    }
    let device = Device::default();
    assert!(
        all.contains(&device),
        "TESSEL_DEVICE names {device}, which is not available; found {all:?}"
    );
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3])?.to(&device)?;
    assert_eq!(x.mul(2.0)?.to_vec::<f32>()?, [2.0, 4.0, 6.0]);
    Ok(())
}

/// A value made of constants and indices moves between devices as an expression: each
/// device computes it where it is used. A node recorded for two devices (the graph merges
/// equal nodes) and realized on one is copied to the other when the other uses it.
#[test]
fn values_made_of_indices_move_as_expressions() -> tessel_tensor::Result<()> {
    use tessel_tensor::DType;
    let (device, cpu) = (Device::default(), Device::cpu());
    for (first, second, scale) in [(device, cpu, 0.5), (cpu, device, 0.25)] {
        let want: Vec<f32> = (0..300).map(|i| (i as f64 * scale + 1.0) as f32).collect();
        let doubled: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
        let a = ((Tensor::arange(0i64, 300, 1)?.cast(DType::F32) * scale)? + 1.0)?.to(&first)?;
        let b = a.to(&second)?;
        assert_eq!((a.device(), b.device()), (first, second));
        assert_eq!(a.to_vec::<f32>()?, want, "on {first}");
        // `b` holds the node `a` realized on `first`: `second` copies it in.
        assert_eq!(
            (&b * 2.0)?.to_vec::<f32>()?,
            doubled,
            "{first}, then {second}"
        );
        let zeros = Tensor::zeros([4, 5], DType::I64).to(&second)?;
        assert_eq!(zeros.to_vec::<i64>()?, vec![0; 20], "on {second}");
    }
    Ok(())
}
