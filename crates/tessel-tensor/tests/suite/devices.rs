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
