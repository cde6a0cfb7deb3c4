//! Extraction over measured candidates: fixed fake costs (cheaper alternatives win, a
//! shared producer beats two separately cheap ones, cycles are never chosen, budgets
//! return the greedy plan) and a seeded comparison with brute force.

use std::time::Duration;

use rustc_hash::FxHashSet;
use tessel_graph::extract::*;

type Spec<'a> = (&'a [u32], &'a [u32], f64);

/// Candidate `i` of `specs` gets id `10 + i`, so ids and indices never coincide.
fn problem(specs: &[Spec<'_>], available: &[u32], targets: &[u32]) -> Problem {
    let ids = |v: &[u32]| v.iter().map(|&c| ClassId(c)).collect::<Vec<_>>();
    let candidates = specs.iter().enumerate();
    Problem {
        candidates: candidates
            .map(|(i, &(w, r, cost))| Candidate {
                id: 10 + i,
                writes: ids(w),
                reads: ids(r),
                computes: Vec::new(),
                cost,
            })
            .collect(),
        available: ids(available),
        targets: ids(targets),
    }
}

fn big() -> Budget {
    Budget {
        max_nodes: usize::MAX,
        max_time: Duration::from_secs(60),
    }
}

/// The extraction with no search nodes at all: greedy plans, known plans and swaps.
fn without_search(p: &Problem) -> Extraction {
    extract(
        p,
        Budget {
            max_nodes: 0,
            ..big()
        },
    )
    .unwrap()
}

fn sorted(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable();
    v
}

/// Runs `order` in sequence: each candidate reads only classes available or already
/// written, writes only fresh classes, and the targets end up produced; a class some
/// candidate computes (other than one it writes) is neither written nor computed by another.
fn valid_order(p: &Problem, order: &[usize]) -> bool {
    let mut have: FxHashSet<ClassId> = p.available.iter().copied().collect();
    let mut used = FxHashSet::default();
    let mut computed = FxHashSet::default();
    let runs = order.iter().all(|&i| {
        let c = &p.candidates[i];
        used.insert(i)
            && c.reads.iter().all(|r| have.contains(r))
            && c.writes.iter().all(|&w| have.insert(w))
            && c.computes
                .iter()
                .filter(|k| !c.writes.contains(k))
                .all(|&k| computed.insert(k))
    });
    runs && computed.iter().all(|k| !have.contains(k)) && p.targets.iter().all(|t| have.contains(t))
}

/// Targets t1 = 1, t2 = 2 and a shared s = 3 over leaf 0 (the brief's example).
fn shared() -> Problem {
    let specs: [Spec<'_>; 5] = [
        (&[3], &[0], 5.0),
        (&[1], &[3], 1.0),
        (&[2], &[3], 1.0),
        (&[1], &[0], 4.0),
        (&[2], &[0], 4.0),
    ];
    problem(&specs, &[0], &[1, 2])
}

#[test]
fn cheaper_alternative_wins_and_runner_up_is_the_other() {
    let p = problem(&[(&[1], &[0], 2.0), (&[1], &[0], 1.0)], &[0], &[1]);
    let e = extract(&p, Budget::default()).unwrap();
    assert_eq!((e.chosen, e.cost, e.exhausted), (vec![1], 1.0, false));
    assert_eq!(e.runner_up, Some((vec![0], 2.0)));
    // The runtime's fallback: drop the failed winner (by id) and extract again.
    let rest = p.without(&[11]);
    let again = extract(&rest, Budget::default()).unwrap();
    assert_eq!(
        (rest.candidates[again.chosen[0]].id, again.runner_up),
        (10, None)
    );
}

#[test]
fn shared_producer_beats_separately_cheap_ones() {
    let p = shared();
    let no_search = Budget {
        max_nodes: 0,
        ..big()
    };
    let greedy = extract(&p, no_search).unwrap();
    assert!(greedy.exhausted);
    assert_eq!(
        sorted(greedy.chosen),
        vec![3, 4],
        "tree costs favour the separate producers"
    );
    let e = extract(&p, Budget::default()).unwrap();
    assert_eq!(
        (e.cost, e.chosen[0]),
        (7.0, 0),
        "the shared producer, first"
    );
    assert!(valid_order(&p, &e.chosen));
    assert_eq!(e.runner_up.map(|r| r.1), Some(8.0));
}

#[test]
fn multi_output_candidate_against_single_ones() {
    for (multi, expect) in [(3.0, vec![0]), (5.0, vec![1, 2])] {
        let p = problem(
            &[(&[1, 2], &[0], multi), (&[1], &[0], 2.0), (&[2], &[0], 2.0)],
            &[0],
            &[1, 2],
        );
        let e = extract(&p, big()).unwrap();
        assert_eq!(sorted(e.chosen.clone()), expect);
        assert!(valid_order(&p, &e.chosen), "never two writers of one class");
    }
}

/// `x == max(x)` over a product `x` (class 1, from leaf 0): a routine writes `x`; the
/// cheapest kernel for the maximum (class 2) computes `x` again, in its own order of
/// additions, and the comparison (class 3) reads both. A plan must not mix the two copies.
#[test]
fn a_value_computed_inline_is_neither_written_nor_computed_again() {
    let mut p = problem(
        &[
            (&[1], &[0], 4.0),    // the routine writing x
            (&[2], &[0], 1.0),    // the maximum, computing x inline
            (&[2], &[1], 2.0),    // the maximum, reading x
            (&[3], &[1, 2], 1.0), // the comparison
        ],
        &[0],
        &[3],
    );
    let unconstrained = extract(&p, big()).unwrap();
    assert_eq!(sorted(unconstrained.chosen), [0, 1, 3]);
    p.candidates[1].computes = vec![ClassId(1)];
    let e = extract(&p, big()).unwrap();
    assert_eq!((sorted(e.chosen.clone()), e.cost), (vec![0, 2, 3], 7.0));
    assert!(valid_order(&p, &e.chosen));
    assert_eq!(e.runner_up, None);
    // Two kernels computing the same sum each for itself are one too many.
    let twice = problem(
        &[(&[2], &[0], 1.0), (&[3], &[0], 1.0), (&[4], &[2, 3], 1.0)],
        &[0],
        &[4],
    );
    let mut twice = twice;
    twice.candidates[0].computes = vec![ClassId(1)];
    twice.candidates[1].computes = vec![ClassId(1)];
    assert!(matches!(
        extract(&twice, big()),
        Err(ExtractError::NoValidPlan { .. })
    ));
    // A known plan breaking the rule is no floor.
    let known = extract_from(&p, big(), &[0, 1, 3]).unwrap();
    assert_eq!(sorted(known.chosen), [0, 2, 3]);
}

#[test]
fn cycles_are_never_chosen() {
    // x = 1 from y = 2 and y from x, both cheap; x from the leaf, dear.
    let p = problem(
        &[(&[1], &[2], 1.0), (&[2], &[1], 1.0), (&[1], &[0], 10.0)],
        &[0],
        &[1, 2],
    );
    let e = extract(&p, big()).unwrap();
    assert_eq!((e.chosen, e.cost, e.runner_up), (vec![2, 1], 11.0, None));
    let err = extract(&p.without(&[12]), big()).unwrap_err();
    assert_eq!(err, ExtractError::OnlyCyclic { target: ClassId(1) });
    assert!(err.to_string().contains("target c1"), "{err}");
    let selfish = problem(&[(&[1], &[1, 0], 1.0)], &[0], &[1]);
    assert!(matches!(
        extract(&selfish, big()),
        Err(ExtractError::OnlyCyclic { .. })
    ));
}

#[test]
fn missing_producer_names_the_class() {
    let err = extract(&problem(&[(&[1], &[5], 1.0)], &[0], &[1]), big()).unwrap_err();
    assert_eq!(
        err,
        ExtractError::NoProducer {
            class: ClassId(5),
            target: ClassId(1)
        }
    );
    assert!(
        err.to_string().contains("class c5, needed for target c1"),
        "{err}"
    );
    let bad = problem(&[(&[1], &[0], f64::NAN)], &[0], &[1]);
    assert!(matches!(
        extract(&bad, big()),
        Err(ExtractError::InvalidCost { id: 10, .. })
    ));
    // Each target alone is producible; together only by writing c2 twice.
    let clash = problem(&[(&[1, 2], &[0], 1.0), (&[2, 3], &[0], 1.0)], &[0], &[1, 3]);
    let err = extract(&clash, big()).unwrap_err();
    assert!(matches!(
        err,
        ExtractError::NoValidPlan {
            exhausted: false,
            ..
        }
    ));
    assert!(err.to_string().contains("producing c1, c3"), "{err}");
    // Overwriting a realized buffer is no way to produce a value.
    let clobber = problem(&[(&[0, 1], &[], 1.0)], &[0], &[1]);
    assert!(matches!(
        extract(&clobber, big()),
        Err(ExtractError::NoProducer { .. })
    ));
}

#[test]
fn tiny_budget_returns_the_greedy_plan() {
    for max_nodes in [0, 1] {
        let e = extract(&shared(), Budget { max_nodes, ..big() }).unwrap();
        assert_eq!((e.cost, e.exhausted), (8.0, true));
        assert!(e.nodes_explored <= max_nodes && valid_order(&shared(), &e.chosen));
    }
}

/// A 30-layer network in two forms: a chain of expensive fused kernels, and cheap
/// products whose inputs each re-read every earlier product (a residual stream kept as a
/// sum). Tree costs count each product once per path and grow as 2^layers, so the
/// tree-cost greedy plan takes the chain; the path-cost one takes the cheap form, and
/// with no search at all that is the plan.
#[test]
fn the_greedy_plan_is_not_fooled_by_shared_values_in_deep_graphs() {
    const LAYERS: u32 = 30;
    let (chain, product, stream) = (100, 200, 300);
    let mut owned: Vec<(Vec<u32>, Vec<u32>, f64)> = Vec::new();
    for l in 0..LAYERS {
        let previous = if l == 0 { 0 } else { chain + l };
        owned.push((vec![chain + l + 1], vec![previous], 1.0));
        let input = if l == 0 { 0 } else { stream + l };
        owned.push((vec![product + l], vec![input], 0.01));
        owned.push((
            (vec![stream + l + 1]),
            (0..=l).map(|k| product + k).collect(),
            0.001,
        ));
    }
    owned.push((vec![1], vec![chain + LAYERS], 0.0));
    owned.push((vec![1], vec![stream + LAYERS], 0.0));
    let specs: Vec<Spec<'_>> = owned.iter().map(|(w, r, c)| (&w[..], &r[..], *c)).collect();
    let p = problem(&specs, &[0], &[1]);
    let e = without_search(&p);
    let cheap = f64::from(LAYERS) * 0.011;
    assert!(
        (e.cost - cheap).abs() < 1e-9,
        "cost {} instead of {cheap}",
        e.cost
    );
    assert!(valid_order(&p, &e.chosen));
}

/// A training step's layer: the forward needs `gelu(x W + b)` (class 3) and the backward
/// needs the pre-activation `x W + b` (class 2) itself. A product with the gelu fused
/// (cost 4.5) is cheaper by tree and by path cost than the plain product plus an
/// elementwise gelu (4.23 + 0.56), so both greedy plans run the product twice; the swap
/// pass sees the pre-activation already written and puts the elementwise gelu in place of
/// the second product. With no search at all that is the plan.
#[test]
fn swaps_reuse_a_value_the_plan_already_writes() {
    let specs: [Spec<'_>; 5] = [
        (&[2], &[0], 4.23),   // x W + b
        (&[3], &[0], 4.5),    // gelu(x W + b), one product with its epilogue
        (&[3], &[2], 0.56),   // gelu of the pre-activation
        (&[4], &[2, 1], 0.6), // the gelu's backward: reads the pre-activation
        (&[5], &[3], 5.0),    // the next layer's product reads the gelu
    ];
    let p = problem(&specs, &[0, 1], &[5, 4]);
    let e = without_search(&p);
    assert_eq!(sorted(e.chosen.clone()), vec![0, 2, 3, 4]);
    assert!((e.cost - 10.39).abs() < 1e-9, "cost {}", e.cost);
    assert!(valid_order(&p, &e.chosen));
}

/// An optimizer's three updates (classes 2, 3, 4, each from the gradient, class 1) as
/// three kernels, or as one kernel writing all three that costs less than the three
/// together but more than any one. Each update's own cheapest producer is its own kernel,
/// so the greedy plans take the three; the swap pass replaces them with the one.
#[test]
fn swaps_merge_writers_into_one_cheaper_kernel() {
    let specs: [Spec<'_>; 5] = [
        (&[1], &[0], 1.0),
        (&[2], &[1], 0.3),
        (&[3], &[1], 0.3),
        (&[4], &[1], 0.3),
        (&[2, 3, 4], &[1], 0.5),
    ];
    let p = problem(&specs, &[0], &[2, 3, 4]);
    let e = without_search(&p);
    assert_eq!(sorted(e.chosen.clone()), vec![0, 4]);
    assert!(valid_order(&p, &e.chosen));
}

/// Attention's gradients: two products (2 and 3) reading a materialized probability
/// matrix (class 1), or one fused kernel writing both from the inputs. The products alone
/// cost less than the fused kernel, so the greedy plans take them; the swap counts the
/// matrix's producer too, which nothing reads once the fused kernel is in, and takes it.
#[test]
fn swaps_count_the_producers_they_leave_unread() {
    let specs: [Spec<'_>; 4] = [
        (&[1], &[0], 2.0),
        (&[2], &[1], 1.0),
        (&[3], &[1], 1.0),
        (&[2, 3], &[0], 3.5),
    ];
    let p = problem(&specs, &[0], &[2, 3]);
    let e = without_search(&p);
    assert_eq!((e.chosen.clone(), e.cost), (vec![3], 3.5));
}

#[test]
fn execution_order_respects_dependencies() {
    // d = 4 from b = 2 and c = 3, both from a = 1, from the leaf; consumers listed first.
    let specs: [Spec<'_>; 4] = [
        (&[4], &[2, 3], 1.0),
        (&[3], &[1], 1.0),
        (&[2], &[1], 1.0),
        (&[1], &[0], 1.0),
    ];
    assert_eq!(
        extract(&problem(&specs, &[0], &[4]), big()).unwrap().chosen,
        vec![3, 1, 2, 0]
    );
    let nothing = extract(&problem(&[], &[0], &[0]), big()).unwrap();
    assert_eq!((nothing.chosen, nothing.cost), (vec![], 0.0));
}

struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }

    fn class(&mut self, lo: usize, hi: usize) -> ClassId {
        ClassId((lo + self.below(hi - lo)) as u32)
    }
}

/// A problem over `classes` classes, the first `leaves` available: mostly a DAG, with
/// some cycles, second outputs and writes of leaves, and tied costs.
fn random_problem(rng: &mut Lcg, classes: usize, leaves: usize) -> Problem {
    let mut candidates: Vec<Candidate> = Vec::new();
    for id in 0..=rng.below(12) {
        let mut writes = vec![rng.class(leaves, classes)];
        if rng.below(4) == 0 {
            let lo = if rng.below(5) == 0 { 0 } else { leaves };
            let w = rng.class(lo, classes);
            if w != writes[0] {
                writes.push(w);
            }
        }
        let below = writes.iter().map(|w| w.0 as usize).min().unwrap();
        let hi = if rng.below(5) == 0 {
            classes
        } else {
            below.max(1)
        };
        let reads = (0..rng.below(3)).map(|_| rng.class(0, hi)).collect();
        let computes = if rng.below(4) == 0 {
            vec![rng.class(leaves, classes)]
        } else {
            Vec::new()
        };
        candidates.push(Candidate {
            id,
            writes,
            reads,
            computes,
            cost: rng.below(10) as f64 * 0.5,
        });
    }
    let mut targets = vec![rng.class(leaves, classes)];
    if rng.below(2) == 0 {
        targets.push(rng.class(0, classes));
    }
    Problem {
        candidates,
        available: (0..leaves as u32).map(ClassId).collect(),
        targets,
    }
}

/// Costs of every valid subset, and of the irredundant ones (each candidate writes
/// something needed): exactly the plans the search enumerates.
fn brute_force(p: &Problem) -> (Vec<f64>, Vec<f64>) {
    let (mut all, mut irredundant) = (Vec::new(), Vec::new());
    for mask in 0u32..1 << p.candidates.len() {
        let set: Vec<&Candidate> = (0..p.candidates.len())
            .filter(|i| mask >> i & 1 == 1)
            .map(|i| &p.candidates[i])
            .collect();
        // Topological placement: fails exactly when the set is cyclic or not closed.
        let mut order: Vec<usize> = Vec::new();
        let mut have: FxHashSet<ClassId> = p.available.iter().copied().collect();
        while let Some(i) = (0..set.len())
            .find(|i| !order.contains(i) && set[*i].reads.iter().all(|r| have.contains(r)))
        {
            order.push(i);
            have.extend(set[i].writes.iter().copied());
        }
        let sub = Problem {
            candidates: set.iter().map(|&c| c.clone()).collect(),
            ..p.clone()
        };
        if order.len() < set.len() || !valid_order(&sub, &order) {
            continue;
        }
        let cost = set.iter().map(|c| c.cost).sum();
        all.push(cost);
        let needed = |c: &ClassId| p.targets.contains(c) || set.iter().any(|d| d.reads.contains(c));
        if set.iter().all(|c| c.writes.iter().any(needed)) {
            irredundant.push(cost);
        }
    }
    all.sort_by(f64::total_cmp);
    irredundant.sort_by(f64::total_cmp);
    (all, irredundant)
}

#[test]
fn matches_brute_force_on_random_problems() {
    let mut rng = Lcg(0x5eed);
    let mut solved = 0;
    for _ in 0..400 {
        let (classes, leaves) = (3 + rng.below(6), 1 + rng.below(2));
        let p = random_problem(&mut rng, classes, leaves);
        let (all, irredundant) = brute_force(&p);
        let result = extract(&p, big());
        let Some(&opt) = all.first() else {
            assert!(result.is_err(), "{p:?}");
            continue;
        };
        solved += 1;
        let e = result.unwrap_or_else(|err| panic!("{err} for {p:?}"));
        assert!(
            !e.exhausted && (e.cost - opt).abs() < 1e-9,
            "{e:?} vs {opt} for {p:?}"
        );
        assert!(valid_order(&p, &e.chosen), "{e:?} for {p:?}");
        match (e.runner_up, irredundant.get(1)) {
            (Some((plan, cost)), Some(&second)) => {
                assert!((cost - second).abs() < 1e-9, "{cost} vs {second} for {p:?}");
                assert!(valid_order(&p, &plan) && sorted(plan) != sorted(e.chosen));
            }
            (None, None) => {}
            (got, want) => panic!("runner-up {got:?}, brute force {want:?} for {p:?}"),
        }
    }
    assert!(solved > 150, "too few feasible random problems: {solved}");
}

#[test]
fn large_problem_within_default_budget() {
    // 1000 classes (100 leaves), two producers each reading 1-3 of the 50 classes below,
    // and every fourth class a third one that also writes the next class: 2025 candidates.
    let mut rng = Lcg(42);
    let mut candidates = Vec::new();
    for c in 100..1000u32 {
        for k in 0..2 + u32::from(c % 4 == 0) {
            let reads = (0..=rng.below(3))
                .map(|_| ClassId(c - 1 - rng.below(50) as u32))
                .collect();
            let second = (k == 2 && c < 999).then_some(ClassId(c + 1));
            let writes = std::iter::once(ClassId(c)).chain(second).collect();
            let cost = 1e-6 * (1 + rng.below(100)) as f64;
            candidates.push(Candidate {
                id: candidates.len(),
                writes,
                reads,
                computes: Vec::new(),
                cost,
            });
        }
    }
    let available = (0..100).map(ClassId).collect();
    let p = Problem {
        candidates,
        available,
        targets: (950..1000).map(ClassId).collect(),
    };
    assert_eq!(p.candidates.len(), 2025);
    let e = extract(&p, Budget::default()).unwrap();
    assert!(valid_order(&p, &e.chosen) && e.nodes_explored <= Budget::default().max_nodes);
}

/// Where both greedy plans write a value twice and the search has no budget left, a known
/// valid plan is the answer; an invalid known plan is ignored.
#[test]
fn a_known_plan_is_the_floor_when_the_greedy_plans_fail() {
    // Targets 1 and 2. Class 1 (the costlier, so resolved first) has a cheapest producer
    // that also writes 3, and every producer of 2 writes 3 too: the greedy plans take the
    // cheap one for 1 and are stuck at 2.
    let specs: [Spec<'_>; 4] = [
        (&[1, 3], &[0], 3.0),
        (&[1], &[0], 5.0),
        (&[2, 3], &[0], 1.0),
        (&[2, 3], &[0], 1.5),
    ];
    let p = problem(&specs, &[0], &[1, 2]);
    let none = Budget {
        max_nodes: 0,
        max_time: Duration::from_secs(60),
    };
    assert!(matches!(
        extract(&p, none),
        Err(ExtractError::NoValidPlan {
            exhausted: true,
            ..
        })
    ));
    let found = extract_from(&p, none, &[1, 2]).unwrap();
    assert_eq!(sorted(found.chosen.clone()), vec![1, 2]);
    assert!(valid_order(&p, &found.chosen));
    assert_eq!(found.cost, 6.0);
    // Writing class 3 twice: not a plan, so ignored.
    assert!(extract_from(&p, none, &[0, 2]).is_err());
    // With a budget the search finds the same plan, the only valid one.
    assert_eq!(
        sorted(extract_from(&p, big(), &[]).unwrap().chosen),
        vec![1, 2]
    );
}
