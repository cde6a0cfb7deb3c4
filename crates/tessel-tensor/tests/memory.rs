//! The graph doesn't grow with history, and a replayed computation compiles nothing.
//!
//! One test in its own binary: it reads process-wide runtime counters, which other tests
//! running in parallel would disturb.

use tessel_tensor::{Result, Tensor, stats};

#[test]
fn realizing_the_same_computation_10_000_times_keeps_the_graph_and_compiles_once() -> Result<()> {
    const N: usize = 64;
    let b = Tensor::from_vec((0..N).map(|i| i as f32 * 0.5).collect::<Vec<_>>(), [N])?;
    let b_sum: f32 = (0..N).map(|i| i as f32 * 0.5).sum();
    let mut nodes_after_10 = 0;
    let mut plans_after_10 = 0;
    for i in 0..10_000 {
        // New data each iteration, the same structure.
        let a = Tensor::from_vec(vec![(i % 100) as f32; N], [N])?;
        let out = a.mul(2.0)?.add(&b)?.sum_all()?;
        let report = out.realize()?;
        assert_eq!(report.kernels, 1, "iteration {i}");
        if i > 0 {
            assert_eq!(report.kernels_prepared(), 0, "iteration {i} compiled again");
        }
        if i % 1000 == 0 {
            let want = 2.0 * (i % 100) as f32 * N as f32 + b_sum;
            assert_eq!(out.item::<f32>()?, want, "iteration {i}");
        }
        drop((a, out));
        if i == 9 {
            let s = stats();
            (nodes_after_10, plans_after_10) = (s.graph_nodes, s.plans);
        }
    }
    let s = stats();
    assert_eq!(s.graph_nodes, nodes_after_10, "the graph grew");
    assert_eq!(s.plans, plans_after_10, "plans were added");
    Ok(())
}
