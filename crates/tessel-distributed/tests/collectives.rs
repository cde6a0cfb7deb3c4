//! Collectives between ranks run as threads of this process over the TCP transport:
//! values of every collective, a group of one, and the failures that must be errors rather
//! than hangs (a mismatched call, a rank that exits, one that stops answering, one that
//! never joins).

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use tessel_distributed::{InitOptions, ProcessGroup, ReduceOp};
use tessel_tensor::{DType, Error, Tensor};

/// A port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `body(group)` on `world` threads, one rank each, and returns their results in rank
/// order.
fn ranks<T: Send>(
    world: usize,
    timeout: Duration,
    body: impl Fn(ProcessGroup) -> T + Sync,
) -> Vec<T> {
    let port = free_port();
    thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let body = &body;
                s.spawn(move || {
                    let options = InitOptions::local(rank, world, port).timeout(timeout);
                    body(ProcessGroup::init(&options).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn collectives_give_every_rank_the_same_values() {
    let results = ranks(3, Duration::from_secs(60), |g| {
        let r = g.rank() as f32;
        // Rank r holds [r, 10 r, -r, r²] in a 2×2.
        let x = Tensor::from_vec(vec![r, 10.0 * r, -r, r * r], [2, 2]).unwrap();
        let sum = g
            .all_reduce(&x, ReduceOp::Sum)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let mean = g
            .all_reduce(&x, ReduceOp::Mean)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let max = g
            .all_reduce(&x, ReduceOp::Max)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let min = g
            .all_reduce(&x, ReduceOp::Min)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let from_2 = g.broadcast(&x, 2).unwrap();
        assert_eq!(from_2.dims(), vec![2, 2]);
        let gathered: Vec<Vec<f32>> = g
            .all_gather(&x)
            .unwrap()
            .iter()
            .map(|t| t.to_vec::<f32>().unwrap())
            .collect();
        // A [3, 3] of (r + 1)·[0, 1, ..., 8]: the sum is 6·[0, ..., 8], rank r gets its row r.
        let rows =
            Tensor::from_vec((0..9).map(|i| i * (g.rank() as i64 + 1)).collect(), [3, 3]).unwrap();
        let part = g
            .reduce_scatter(&rows, ReduceOp::Sum)
            .unwrap()
            .to_vec::<i64>()
            .unwrap();
        let half = x.cast(DType::BF16);
        let half_sum = g.all_reduce(&half, ReduceOp::Sum).unwrap();
        assert_eq!(half_sum.dtype(), DType::BF16);
        g.barrier().unwrap();
        (
            sum,
            mean,
            max,
            min,
            from_2.to_vec::<f32>().unwrap(),
            gathered,
            part,
            half_sum.cast(DType::F32).to_vec::<f32>().unwrap(),
        )
    });
    for (rank, (sum, mean, max, min, from_2, gathered, part, half_sum)) in
        results.into_iter().enumerate()
    {
        assert_eq!(sum, vec![3.0, 30.0, -3.0, 5.0], "rank {rank}");
        assert_eq!(mean, vec![1.0, 10.0, -1.0, 5.0 / 3.0], "rank {rank}");
        assert_eq!(max, vec![2.0, 20.0, 0.0, 4.0], "rank {rank}");
        assert_eq!(min, vec![0.0, 0.0, -2.0, 0.0], "rank {rank}");
        assert_eq!(from_2, vec![2.0, 20.0, -2.0, 4.0], "rank {rank}");
        assert_eq!(
            gathered,
            vec![
                vec![0.0, 0.0, 0.0, 0.0],
                vec![1.0, 10.0, -1.0, 1.0],
                vec![2.0, 20.0, -2.0, 4.0]
            ],
            "rank {rank}"
        );
        let r = rank as i64;
        assert_eq!(part, vec![18 * r, 18 * r + 6, 18 * r + 12], "rank {rank}");
        assert_eq!(half_sum, vec![3.0, 30.0, -3.0, 5.0], "rank {rank}");
    }
}

#[test]
fn a_group_of_one_returns_its_input() {
    let g = ProcessGroup::init(&InitOptions::local(0, 1, 1)).unwrap();
    assert_eq!((g.rank(), g.world_size()), (0, 1));
    let x = Tensor::from_vec(vec![1.5f32, -2.0, 3.25], [3]).unwrap();
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        assert_eq!(
            g.all_reduce(&x, op).unwrap().to_vec::<f32>().unwrap(),
            vec![1.5, -2.0, 3.25]
        );
    }
    assert_eq!(
        g.broadcast(&x, 0).unwrap().to_vec::<f32>().unwrap(),
        vec![1.5, -2.0, 3.25]
    );
    assert!(g.broadcast(&x, 1).is_err());
    assert_eq!(g.all_gather(&x).unwrap().len(), 1);
    // Misuse is an error before any communication.
    let ints = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
    let e = g.all_reduce(&ints, ReduceOp::Mean).unwrap_err();
    assert!(
        e.to_string().contains("ReduceOp::Mean needs a float"),
        "{e}"
    );
    let e = ProcessGroup::init(&InitOptions::local(2, 2, 1)).unwrap_err();
    assert!(
        e.to_string().contains("ranks run from 0 to WORLD_SIZE - 1"),
        "{e}"
    );
}

#[test]
fn mismatched_calls_fail_on_every_rank() {
    let results = ranks(2, Duration::from_secs(60), |g| {
        let n = 4 + g.rank();
        let x = Tensor::from_vec(vec![1.0f32; n], [n]).unwrap();
        let first = g.all_reduce(&x, ReduceOp::Sum).map(drop);
        // The group is unusable afterwards, and says so at once.
        let second = g.barrier();
        (first, second)
    });
    for (rank, (first, second)) in results.into_iter().enumerate() {
        let e = first.unwrap_err();
        assert!(
            matches!(
                e,
                Error::Collective {
                    op: "all_reduce",
                    ..
                }
            ),
            "rank {rank}: {e}"
        );
        assert!(
            e.to_string()
                .contains("rank 1 called all_reduce #1 of 5 f32 elements"),
            "rank {rank}: {e}"
        );
        let e = second.unwrap_err();
        assert!(e.to_string().contains("failed earlier"), "rank {rank}: {e}");
    }
}

#[test]
fn a_rank_that_exits_is_an_error_not_a_hang() {
    let start = Instant::now();
    let results = ranks(3, Duration::from_secs(60), |g| {
        if g.rank() == 2 {
            // Leaves without calling anything: its connection closes.
            return None;
        }
        let x = Tensor::from_vec(vec![1.0f32; 8], [8]).unwrap();
        Some(g.all_reduce(&x, ReduceOp::Sum).map(drop))
    });
    for (rank, result) in results.into_iter().enumerate().take(2) {
        let e = result.unwrap().unwrap_err();
        assert!(
            e.to_string().contains("rank 2 closed its connection"),
            "rank {rank}: {e}"
        );
    }
    // Well within the minute's timeout: a closed connection is noticed at once.
    assert!(start.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_rank_that_stops_answering_times_out() {
    let results = ranks(2, Duration::from_secs(2), |g| {
        if g.rank() == 1 {
            // Alive, but never calls the collective (keeps its connection open).
            thread::sleep(Duration::from_secs(5));
            return None;
        }
        let x = Tensor::from_vec(vec![1.0f32; 8], [8]).unwrap();
        let start = Instant::now();
        let result = g.all_reduce(&x, ReduceOp::Sum).map(drop);
        Some((result, start.elapsed()))
    });
    let (result, waited) = results.into_iter().next().unwrap().unwrap();
    let e = result.unwrap_err();
    assert!(
        e.to_string().contains("rank 1 did not answer within 2 s"),
        "{e}"
    );
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
}

#[test]
fn a_rank_that_never_joins_fails_the_init() {
    let port = free_port();
    let options = InitOptions::local(0, 2, port).timeout(Duration::from_millis(500));
    let e = ProcessGroup::init(&options).unwrap_err();
    assert!(
        e.to_string().contains("ranks [1] did not join within"),
        "{e}"
    );
    let options = InitOptions::local(1, 2, port).timeout(Duration::from_millis(500));
    let e = ProcessGroup::init(&options).unwrap_err();
    assert!(e.to_string().contains("cannot reach rank 0"), "{e}");
}

#[test]
fn dtypes_that_cannot_move_are_errors_in_any_world() {
    let g = ProcessGroup::init(&InitOptions::local(0, 1, 1)).unwrap();
    let x = Tensor::from_vec(vec![1u16, 2], [2]).unwrap();
    let e = g.broadcast(&x, 0).unwrap_err();
    assert!(
        e.to_string()
            .contains("u16 tensors are not sent between ranks"),
        "{e}"
    );
    assert!(g.all_gather(&x).is_err());
    assert!(g.all_reduce(&x, ReduceOp::Sum).is_err());
}
