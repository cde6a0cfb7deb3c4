//! `DistributedDataParallel` across processes: two processes (this test binary started
//! again, one rank each) train an MLP with `AdamW`, each on half of every batch, and end
//! with the weights one process reaches on the whole batches.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tessel_distributed::{DistributedDataParallel, InitOptions, ProcessGroup};
use tessel_nn::loss::{CrossEntropyOptions, cross_entropy};
use tessel_nn::optim::{AdamW, AdamWConfig};
use tessel_nn::{Linear, Module, ReLU, Sequential};
use tessel_tensor::Tensor;

/// Set in the processes this test starts: the rank's output file.
const CHILD_OUT: &str = "TESSEL_DDP_TEST_OUT";
const STEPS: usize = 8;
const BATCH: usize = 16;

/// Samples `start..start + n` of a fixed synthetic data set: 16 features in `[-1, 1)`,
/// the class the sign pattern of two features gives.
fn samples(start: usize, n: usize) -> (Tensor, Tensor) {
    let mut x = Vec::with_capacity(n * 16);
    let mut y = Vec::with_capacity(n);
    for i in start..start + n {
        let mut z = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let row: Vec<f32> = (0..16)
            .map(|_| {
                z ^= z >> 29;
                z = z.wrapping_mul(0xbf58_476d_1ce4_e5b9);
                ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        y.push(i64::from(row[0] > 0.0) * 2 + i64::from(row[1] > 0.0));
        x.extend(row);
    }
    (
        Tensor::from_vec(x, [n, 16]).unwrap(),
        Tensor::from_vec(y, [n]).unwrap(),
    )
}

/// The model, initialized from `seed`.
fn mlp(seed: u64) -> Sequential {
    Tensor::manual_seed(seed);
    Sequential::new()
        .layer(Linear::new(16, 32).unwrap())
        .layer(ReLU)
        .layer(Linear::new(32, 4).unwrap())
}

/// Trains with `group`, this rank taking its `1 / world` share of each batch, and returns
/// the final parameters.
fn train(group: &ProcessGroup, seed: u64) -> Vec<Vec<f32>> {
    let model = mlp(seed);
    let ddp = DistributedDataParallel::new(group, model.parameters()).unwrap();
    let mut opt = AdamW::new(
        model.parameters(),
        AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        },
    )
    .unwrap();
    let share = BATCH / group.world_size();
    for step in 0..STEPS {
        let (x, y) = samples(step * BATCH + group.rank() * share, share);
        let loss = cross_entropy(
            &model.forward(&x).unwrap(),
            &y,
            &CrossEntropyOptions::default(),
        )
        .unwrap();
        ddp.step(&mut opt, &loss).unwrap();
    }
    model
        .parameters()
        .iter()
        .map(|p| p.to_vec::<f32>().unwrap())
        .collect()
}

fn write(path: &Path, params: &[Vec<f32>]) {
    let bytes: Vec<u8> = params
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(path, bytes).unwrap();
}

fn read(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A rank of the two-process run (does nothing unless started by the test below).
#[test]
fn ddp_rank() {
    let Some(out) = std::env::var_os(CHILD_OUT) else {
        return;
    };
    let options = InitOptions::from_env()
        .unwrap()
        .timeout(Duration::from_secs(120));
    let group = ProcessGroup::init(&options).unwrap();
    // Different seeds per rank: the start must still be rank 0's weights.
    write(Path::new(&out), &train(&group, 100 + group.rank() as u64));
}

#[test]
fn two_ranks_train_like_one_rank_with_the_doubled_batch() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("tessel-ddp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&exe)
                .args(["ddp_rank", "--exact", "--nocapture", "--test-threads=1"])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env(CHILD_OUT, dir.join(format!("rank{rank}")))
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, mut child) in children.into_iter().enumerate() {
        assert!(child.wait().unwrap().success(), "rank {rank} failed");
    }
    let ranks = [read(&dir.join("rank0")), read(&dir.join("rank1"))];
    let _ = std::fs::remove_dir_all(&dir);
    // Both ranks hold the same parameters, bit for bit (they applied the same averages).
    assert_eq!(ranks[0], ranks[1]);
    let alone = ProcessGroup::init(&InitOptions::local(0, 1, 0)).unwrap();
    let single: Vec<f32> = train(&alone, 100).into_iter().flatten().collect();
    assert_eq!(single.len(), ranks[0].len());
    // Training moved the weights well past the tolerance: the comparison is not vacuous.
    let start: Vec<f32> = mlp(100)
        .parameters()
        .iter()
        .flat_map(|p| p.to_vec::<f32>().unwrap())
        .collect();
    assert!(start.iter().zip(&single).any(|(a, b)| (a - b).abs() > 1e-2));
    let worst = single
        .iter()
        .zip(&ranks[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= 1e-5,
        "largest difference from one rank on the whole batch: {worst}"
    );
}
