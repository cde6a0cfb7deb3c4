//! A training loop neither grows memory nor compiles after its first steps.
//!
//! Its own binary: it reads process-wide runtime counters, which tests running in parallel
//! would disturb.

use tessel_tensor::{DType, Result, Tensor, stats};

/// The resident set size of this process in bytes (Linux), if it can be read.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// 10 000 SGD steps of a two-layer MLP with dropout: each step records the forward pass
/// (a new dropout draw), its gradients and the updates, realizes them as one plan and
/// assigns the new parameters. Buffers, graph nodes and plans stay the same from step 1,
/// nothing compiles after it, and the resident memory grows by less than 16 MiB between
/// step 1000 and the last.
#[test]
fn ten_thousand_training_steps_keep_buffers_nodes_plans_and_memory_flat() -> Result<()> {
    const STEPS: usize = 10_000;
    Tensor::manual_seed(3);
    let x = Tensor::randn([16, 8], DType::F32)?;
    let target = Tensor::randn([16, 2], DType::F32)?;
    let params = [
        Tensor::randn([8, 16], DType::F32)?.mul(0.3)?,
        Tensor::zeros([16], DType::F32),
        Tensor::randn([16, 2], DType::F32)?.mul(0.3)?,
        Tensor::zeros([2], DType::F32),
    ];
    Tensor::realize_all(&params.iter().collect::<Vec<_>>())?;
    let mut first_loss = 0.0;
    let mut baseline = None;
    let mut rss_at_1000 = None;
    for step in 0..STEPS {
        let h = x.matmul(&params[0])?.add(&params[1])?.tanh().dropout(0.1)?;
        let y = h.matmul(&params[2])?.add(&params[3])?;
        let loss = y.sub(&target)?.pow(2.0)?.mean_all()?;
        let grads = loss.backward(&params.iter().collect::<Vec<_>>())?;
        let updated: Vec<Tensor> = params
            .iter()
            .zip(&grads)
            .map(|(p, g)| p.sub(&g.mul(0.05)?))
            .collect::<Result<_>>()?;
        let mut outputs = vec![&loss];
        outputs.extend(&updated);
        let report = Tensor::realize_all(&outputs)?;
        for (p, u) in params.iter().zip(&updated) {
            p.assign(u)?;
        }
        let loss = loss.item::<f32>()?;
        if step == 0 {
            first_loss = loss;
        }
        drop((grads, updated));
        if step >= 1 {
            assert_eq!(report.kernels_prepared(), 0, "step {step} compiled");
        }
        let s = stats();
        let now = (s.buffers, s.graph_nodes, s.plans);
        match baseline {
            None if step == 1 => baseline = Some(now),
            Some(b) => assert_eq!(now, b, "step {step}: (buffers, nodes, plans) changed"),
            None => {}
        }
        if step == 1000 {
            rss_at_1000 = resident_bytes();
        }
        if step == STEPS - 1 {
            assert!(
                loss < 0.5 * first_loss,
                "the loss fell from {first_loss} to {loss}"
            );
            if let (Some(before), Some(after)) = (rss_at_1000, resident_bytes()) {
                assert!(
                    after < before + (16 << 20),
                    "resident memory grew from {before} to {after} bytes"
                );
            }
        }
    }
    Ok(())
}
