//! Eight threads realizing graphs at once: `Tensor` is `Send + Sync` and the runtime's one
//! lock is never held across compiling or running, so every thread's values stay right.

use std::time::{Duration, Instant};

use tessel_tensor::{Result, Tensor};

/// Each thread builds `(x * k + w).relu().sum(-1)` from its own data and a weight shared
/// by all, realizes it over and over (new data every round, so plans replay and buffers
/// are reused across threads) and checks every value against plain Rust.
#[test]
fn eight_threads_realizing_graphs_get_their_own_values() -> Result<()> {
    let shared: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
    let w = Tensor::from_vec(shared.clone(), [4, 16])?;
    w.realize()?;
    let deadline = Instant::now() + Duration::from_secs(3);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let (w, shared) = (w.clone(), shared.clone());
                scope.spawn(move || -> Result<usize> {
                    let mut rounds = 0;
                    while rounds < 20 || Instant::now() < deadline {
                        let k = (t * 1000 + rounds) as f32 / 64.0;
                        let data: Vec<f32> =
                            (0..64).map(|i| ((i * 7 + t) % 13) as f32 - 6.0).collect();
                        let x = Tensor::from_vec(data.clone(), [4, 16])?;
                        let y = (&(&x * f64::from(k))? + &w)?.relu().sum(&[-1], false)?;
                        let got = y.to_vec::<f32>()?;
                        for row in 0..4 {
                            let want: f32 = (0..16)
                                .map(|c| (data[row * 16 + c] * k + shared[row * 16 + c]).max(0.0))
                                .sum();
                            assert!(
                                (got[row] - want).abs() <= 1e-4 * want.abs().max(1.0),
                                "thread {t} round {rounds} row {row}: {} vs {want}",
                                got[row]
                            );
                        }
                        rounds += 1;
                    }
                    Ok(rounds)
                })
            })
            .collect();
        for h in handles {
            let rounds = h.join().expect("a thread panicked")?;
            assert!(rounds >= 20);
        }
        Ok(())
    })
}
