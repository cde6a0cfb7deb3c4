//! Extraction: the cheapest closed set of measured candidates that produces the targets.
//!
//! The e-graph planner hands this module pure data: values ([`ClassId`]s), the classes that
//! are already realized (free), the classes the caller wants, and [`Candidate`] programs, each
//! writing one or more classes from the classes it reads at a measured cost. [`extract`]
//! picks the candidates to run.
//!
//! # Invariants of a plan
//!
//! - *Closed*: every target and every class a chosen candidate reads is available or written
//!   by a chosen candidate.
//! - *Single writer*: no class is written by two chosen candidates. An available class counts
//!   as written already: a leaf keeps its own buffer, so a candidate that would overwrite it
//!   is never chosen.
//! - *Acyclic*: the chosen candidates run in an order where each runs after the producers of
//!   what it reads. [`Extraction::chosen`] is such an order.
//! - *Computed once*: a class a chosen candidate computes without writing it
//!   ([`Candidate::computes`]) is written by no chosen candidate and computed by no other.
//!
//! The cost of a plan is the sum of its candidates' costs; a producer shared by several
//! consumers is paid once, which is why the best plan is a set, not a tree per target.
//!
//! # Algorithm
//!
//! 1. **Tree costs** (Knuth's generalisation of Dijkstra to AND-OR graphs): a candidate is
//!    ready once all its reads are settled; its tree cost is its cost plus its reads' tree
//!    costs, and a class settles at its cheapest ready producer. Classes that only cycles can
//!    produce never settle, so cycles need no special case, and candidates reading such a
//!    class are dropped: they cannot be in any acyclic plan. Settling order gives each class
//!    a `rank`; it is near-linear (`O((C + E) log C)`).
//! 2. **Greedy plan** (the upper bound): from the targets, highest rank first (consumers
//!    before producers), give each needed class its cheapest-by-tree-cost producer that
//!    writes no class already written and closes no cycle (the check of step 3). No
//!    backtracking: if a class has no such producer, only the search can find a plan.
//!    A second greedy plan orders producers by *path* cost instead (cost plus the largest
//!    path cost among the reads): tree costs count a shared producer once per path to it,
//!    which in deep graphs of shared values overprices the forms that share most. The
//!    cheaper of the two is the first upper bound. A caller that knows a valid plan (the
//!    planner's default partition) offers it too ([`extract_from`]), so the result is never
//!    worse than it even where both greedy plans fail and the budget runs out.
//! 3. **Branch and bound**: depth first, pick the unresolved needed class of highest rank and
//!    try its producers in tree-cost order, skipping any that would write a written class or
//!    close a cycle (a walk from its reads through chosen writers reaching its writes). A node
//!    is pruned when `cost so far + lower bound` cannot beat the plans kept. The lower bound
//!    sums, over unresolved classes, the cheapest `cost / writes.len()` among their
//!    producers. It is admissible: each unresolved class is written by exactly one new
//!    candidate, which writes at most `writes.len()` of them, so the shares charged to a
//!    candidate never exceed its cost.
//!
//! 4. **Swaps**: the best plan, before the search and after it, is improved locally. A
//!    candidate outside the plan whose reads the plan already writes replaces the chosen
//!    writers of its classes (which must write nothing else) when that costs less, counting
//!    also the candidates whose writes nothing reads any more once they are gone; until no
//!    swap helps. Neither tree nor path costs see that a value is needed anyway, nor what a
//!    producer's removal frees: a training step keeps a product's pre-activation for the
//!    backward, yet both greedy plans compute its activation with a second product
//!    carrying the activation as an epilogue rather than with an elementwise kernel reading
//!    the pre-activation; and a fused attention backward costs more than the three products
//!    it replaces, but less than they and the probability matrix they read. Where the
//!    search runs out first, swaps fix both.
//!
//! The search keeps the two cheapest distinct plans (pruning against the second), so
//! [`Extraction::runner_up`] is the true second-best plan when the search completes and the
//! runtime has a fallback if the winner fails; [`Problem::without`] re-extracts without a
//! failed candidate. Search is bounded by a [`Budget`]; when it runs out the best plan so far
//! (at worst the greedy one) is returned with `exhausted: true`.
//!
//! Unlike the seed's extraction (zyx 0.17), nothing here panics on a bad problem (errors
//! name the class), two candidates never write one class, a cycle is never chosen, the
//! search is budgeted instead of exponential, and the bound prunes before costs add up.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// A value (e-class) of the extraction problem; prints as `c{N}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassId(pub u32);

impl fmt::Display for ClassId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// A program that could run: it reads some classes and writes others.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The caller's identifier (e.g. an e-node id); opaque to extraction.
    pub id: usize,
    /// The classes it produces; a candidate writing nothing is never chosen.
    pub writes: Vec<ClassId>,
    /// The classes it needs.
    pub reads: Vec<ClassId>,
    /// Classes it computes for itself, neither reading nor writing them, that a plan must
    /// compute only once: a float sum computed twice, in two orders, differs in its last
    /// bits, and a plan comparing the two copies (`x == max(x)`) then finds no maximum.
    pub computes: Vec<ClassId>,
    /// Measured time in seconds; finite and non-negative.
    pub cost: f64,
}

/// An extraction problem: candidates, free classes and wanted classes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Problem {
    /// Every candidate; [`Extraction::chosen`] indexes this vector.
    pub candidates: Vec<Candidate>,
    /// Classes available for free (realized buffers).
    pub available: Vec<ClassId>,
    /// Classes the plan must produce (or find available).
    pub targets: Vec<ClassId>,
}

impl Problem {
    /// The same problem without the candidates whose [`Candidate::id`] is in `excluded`, e.g.
    /// to re-extract after a chosen candidate failed to run. Indices shift: map the new
    /// extraction's indices through the new problem's candidates.
    pub fn without(&self, excluded: &[usize]) -> Problem {
        let mut rest = self.clone();
        rest.candidates.retain(|c| !excluded.contains(&c.id));
        rest
    }
}

/// Limits on the branch-and-bound search; the greedy plan is always computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Search nodes (partial plans expanded) at most.
    pub max_nodes: usize,
    /// Wall-clock time at most, counted from the call to [`extract`].
    pub max_time: Duration,
}

impl Default for Budget {
    /// 20 000 nodes or 20 ms, whichever comes first.
    fn default() -> Self {
        Budget {
            max_nodes: 20_000,
            max_time: Duration::from_millis(20),
        }
    }
}

/// The result of [`extract`].
#[derive(Clone, Debug, PartialEq)]
pub struct Extraction {
    /// Indices into [`Problem::candidates`], in a valid execution order (producers first).
    pub chosen: Vec<usize>,
    /// Sum of the chosen candidates' costs.
    pub cost: f64,
    /// The cheapest other plan found (same format as `chosen`) and its cost: the fallback if
    /// the winner fails at execution.
    pub runner_up: Option<(Vec<usize>, f64)>,
    /// The budget ran out before the search finished, so `chosen` may not be optimal.
    pub exhausted: bool,
    /// Search nodes expanded.
    pub nodes_explored: usize,
}

/// Why no plan could be extracted.
#[derive(Clone, Debug, PartialEq)]
pub enum ExtractError {
    /// A candidate's cost is NaN, infinite or negative.
    InvalidCost {
        /// The candidate's [`Candidate::id`].
        id: usize,
        /// The offending cost.
        cost: f64,
    },
    /// `class` is needed for `target` but is not available and no candidate can write it.
    NoProducer {
        /// The class nothing produces.
        class: ClassId,
        /// The target that needs it.
        target: ClassId,
    },
    /// Every way to produce `target` depends on itself: only cyclic plans exist.
    OnlyCyclic {
        /// The target.
        target: ClassId,
    },
    /// Each target is producible alone, but every plan found needs two candidates writing one
    /// class, or computing one they must compute once (or a cycle between them).
    NoValidPlan {
        /// The targets.
        targets: Vec<ClassId>,
        /// The search stopped on its budget, so a plan may still exist.
        exhausted: bool,
    },
}

impl fmt::Display for ExtractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExtractError::InvalidCost { id, cost } => {
                write!(f, "candidate {id} has cost {cost}, not a finite time >= 0")
            }
            ExtractError::NoProducer { class, target } => {
                write!(
                    f,
                    "class {class}, needed for target {target}, has no producer"
                )
            }
            ExtractError::OnlyCyclic { target } => {
                write!(
                    f,
                    "target {target} can only be produced from itself (a cycle)"
                )
            }
            ExtractError::NoValidPlan { targets, exhausted } => {
                let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
                let why = if *exhausted {
                    "found within the budget"
                } else {
                    "exists"
                };
                write!(
                    f,
                    "no plan producing {} without writing or computing a value twice {why}",
                    names.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for ExtractError {}

/// Extracts the cheapest closed, single-writer, acyclic plan producing `problem.targets`.
/// See the module docs for the algorithm and guarantees.
pub fn extract(problem: &Problem, budget: Budget) -> Result<Extraction, ExtractError> {
    extract_from(problem, budget, &[])
}

/// [`extract`], also starting from `known`, a plan the caller knows (candidate positions in
/// `problem.candidates`; ignored unless it is closed, single-writer and acyclic): the
/// result is never worse than it, whatever the budget.
pub fn extract_from(
    problem: &Problem,
    budget: Budget,
    known: &[usize],
) -> Result<Extraction, ExtractError> {
    let start = Instant::now();
    let m = Model::new(problem)?;
    for &t in &m.targets {
        if m.tree[t] == f64::INFINITY {
            return Err(m.diagnose(problem, t));
        }
    }
    let mut s = Search::new(&m, budget, start);
    for (name, order) in [("tree", &m.producers), ("path", &m.by_path)] {
        let plan = s.greedy(order);
        let cost = plan
            .as_ref()
            .map(|p| p.iter().map(|&c| m.cost[c]).sum::<f64>());
        tracing::debug!(target: "tessel::plan", "greedy plan by {name} cost: {cost:?} s");
        if let Some(plan) = plan {
            s.offer(plan);
        }
    }
    if !known.is_empty() {
        let mut plan = known.to_vec();
        plan.sort_unstable();
        plan.dedup();
        if m.is_plan(&plan) {
            s.offer(plan);
        } else {
            tracing::debug!(target: "tessel::plan", "the known plan is not a valid plan; ignored");
        }
    }
    // Before the search (a lower threshold prunes more) and after it.
    s.improve_best();
    s.run();
    s.improve_best();
    let Some((best, cost)) = s.best.take() else {
        return Err(ExtractError::NoValidPlan {
            targets: m.targets.iter().map(|&t| m.classes[t]).collect(),
            exhausted: s.exhausted,
        });
    };
    Ok(Extraction {
        chosen: m.execution_order(&best),
        cost,
        runner_up: s
            .second
            .take()
            .map(|(plan, c)| (m.execution_order(&plan), c)),
        exhausted: s.exhausted,
        nodes_explored: s.nodes,
    })
}

/// Marks "no candidate" / "no rank" in dense tables.
const NONE: usize = usize::MAX;

/// Knuth's generalisation of Dijkstra to AND-OR graphs: each class's cheapest cost, each
/// candidate's cost (its own plus its reads' costs folded by `combine`: a sum gives tree
/// costs, a max path costs), and the order classes settled in (0 for available, `NONE` if
/// only cycles produce them). A cost is tentative until its class is ranked; heap keys are
/// cost bits, since non-negative floats order like their bit patterns.
fn and_or_costs(
    available: &[bool],
    eligible: &[bool],
    reads: &[Vec<usize>],
    writes: &[Vec<usize>],
    cost: &[f64],
    combine: fn(f64, f64) -> f64,
) -> (Vec<f64>, Vec<f64>, Vec<usize>) {
    let (n, np) = (available.len(), cost.len());
    let mut readers = vec![Vec::new(); n];
    for p in (0..np).filter(|&p| eligible[p]) {
        reads[p].iter().for_each(|&r| readers[r].push(p));
    }
    let mut missing: Vec<usize> = reads.iter().map(Vec::len).collect();
    let mut class_cost: Vec<f64> = available
        .iter()
        .map(|&a| if a { 0.0 } else { f64::INFINITY })
        .collect();
    let mut rank: Vec<usize> = available
        .iter()
        .map(|&a| if a { 0 } else { NONE })
        .collect();
    let mut candidate_cost = vec![f64::INFINITY; np];
    let mut ready: Vec<usize> = (0..np)
        .filter(|&p| eligible[p] && missing[p] == 0)
        .collect();
    let (mut heap, mut settled) = (BinaryHeap::new(), 0);
    loop {
        for p in ready.drain(..) {
            let inputs = reads[p].iter().map(|&r| class_cost[r]).fold(0.0, combine);
            candidate_cost[p] = cost[p] + inputs;
            for &w in &writes[p] {
                if candidate_cost[p] < class_cost[w] {
                    class_cost[w] = candidate_cost[p];
                    heap.push(Reverse((candidate_cost[p].to_bits(), w)));
                }
            }
        }
        let Some(Reverse((_, c))) = heap.pop() else {
            break;
        };
        if rank[c] == NONE {
            settled += 1;
            rank[c] = settled;
            for &p in &readers[c] {
                missing[p] -= 1;
                if missing[p] == 0 {
                    ready.push(p);
                }
            }
        }
    }
    (class_cost, candidate_cost, rank)
}

/// Dense, validated form of a [`Problem`], shared by the greedy pass and the search.
struct Model {
    /// Dense class index to its id.
    classes: Vec<ClassId>,
    available: Vec<bool>,
    /// Needed targets (not available), deduplicated.
    targets: Vec<usize>,
    /// Per candidate, deduplicated.
    writes: Vec<Vec<usize>>,
    /// Per candidate, deduplicated, available classes dropped (they order nothing).
    reads: Vec<Vec<usize>>,
    /// Per candidate, deduplicated, its own writes dropped.
    computes: Vec<Vec<usize>>,
    cost: Vec<f64>,
    /// Per class: the candidates that may appear in some plan, cheapest tree cost first.
    producers: Vec<Vec<usize>>,
    /// The same candidates, cheapest path cost first: a candidate's cost plus the largest
    /// path cost among its reads. Tree costs count a shared producer once per reader, so
    /// in a deep graph whose values all read one chain (a residual stream kept as a sum of
    /// every layer's output) they grow exponentially with depth and make the greedy plan
    /// shun that form; path costs stay linear.
    by_path: Vec<Vec<usize>>,
    /// Per class: tree cost (0 if available, infinite if only cycles produce it).
    tree: Vec<f64>,
    /// Per class: settling order of the tree-cost pass (0 for available, `NONE` if unsettled).
    rank: Vec<usize>,
    /// Per class: the admissible lower-bound share, min over producers of cost / writes.
    share: Vec<f64>,
    /// Per candidate: whether some plan may hold it (eligible, every read producible).
    usable: Vec<bool>,
}

impl Model {
    fn new(problem: &Problem) -> Result<Model, ExtractError> {
        let cands = &problem.candidates;
        if let Some(c) = cands.iter().find(|c| !c.cost.is_finite() || c.cost < 0.0) {
            return Err(ExtractError::InvalidCost {
                id: c.id,
                cost: c.cost,
            });
        }
        let mut index: FxHashMap<ClassId, usize> = FxHashMap::default();
        let mut classes = Vec::new();
        // Sorted, deduplicated dense indices; interns classes on first sight.
        let mut dense = |ids: &[ClassId]| {
            let mut new = |c| {
                classes.push(c);
                classes.len() - 1
            };
            let mut v: Vec<usize> = ids
                .iter()
                .map(|&c| *index.entry(c).or_insert_with(|| new(c)))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let leaves = dense(&problem.available);
        let mut targets = dense(&problem.targets);
        let writes: Vec<Vec<usize>> = cands.iter().map(|c| dense(&c.writes)).collect();
        let mut reads: Vec<Vec<usize>> = cands.iter().map(|c| dense(&c.reads)).collect();
        let mut computes: Vec<Vec<usize>> = cands.iter().map(|c| dense(&c.computes)).collect();
        for (computed, written) in computes.iter_mut().zip(&writes) {
            computed.retain(|c| written.binary_search(c).is_err());
        }
        let cost: Vec<f64> = cands.iter().map(|c| c.cost).collect();
        let (n, np) = (classes.len(), cands.len());
        let mut available = vec![false; n];
        for c in leaves {
            available[c] = true;
        }
        targets.retain(|&t| !available[t]);
        for r in &mut reads {
            r.retain(|&c| !available[c]);
        }
        // Never overwrite (or compute again) a realized buffer, and a candidate reading its
        // own output is a cycle of one: neither can be in a plan, and the cycle check
        // assumes neither.
        let eligible: Vec<bool> = (0..np)
            .map(|p| {
                writes[p]
                    .iter()
                    .all(|&w| !available[w] && reads[p].binary_search(&w).is_err())
                    && computes[p].iter().all(|&c| !available[c])
            })
            .collect();

        let (tree, ctree, rank) =
            and_or_costs(&available, &eligible, &reads, &writes, &cost, |a, b| a + b);
        let (_, cpath, _) = and_or_costs(&available, &eligible, &reads, &writes, &cost, f64::max);

        // A candidate is usable iff all its reads settled: then its writes settled too.
        let mut producers = vec![Vec::new(); n];
        let mut share = vec![f64::INFINITY; n];
        let usable: Vec<bool> = (0..np)
            .map(|p| eligible[p] && ctree[p].is_finite())
            .collect();
        for p in (0..np).filter(|&p| usable[p]) {
            for &w in &writes[p] {
                producers[w].push(p);
                share[w] = share[w].min(cost[p] / writes[p].len() as f64);
            }
        }
        for list in &mut producers {
            list.sort_unstable_by(|&a, &b| {
                ctree[a]
                    .total_cmp(&ctree[b])
                    .then(cost[a].total_cmp(&cost[b]))
                    .then(a.cmp(&b))
            });
        }
        let mut by_path = producers.clone();
        for list in &mut by_path {
            list.sort_by(|&a, &b| cpath[a].total_cmp(&cpath[b]));
        }
        Ok(Model {
            classes,
            available,
            targets,
            writes,
            reads,
            computes,
            cost,
            producers,
            by_path,
            tree,
            rank,
            share,
            usable,
        })
    }

    /// Explains why `target` has no finite tree cost: the first class on its producer paths
    /// that nothing writes, or else a cycle.
    fn diagnose(&self, problem: &Problem, target: usize) -> ExtractError {
        let mut seen = vec![false; self.classes.len()];
        let mut stack = vec![target];
        while let Some(c) = stack.pop() {
            if std::mem::replace(&mut seen[c], true) {
                continue;
            }
            // Any candidate writing `c` counts here, even one excluded from plans, so that
            // a self-reading candidate is reported as a cycle rather than as no producer.
            let writers: Vec<usize> = (0..problem.candidates.len())
                .filter(|&p| {
                    self.writes[p].contains(&c)
                        && self.writes[p].iter().all(|&w| !self.available[w])
                })
                .collect();
            if writers.is_empty() {
                return ExtractError::NoProducer {
                    class: self.classes[c],
                    target: self.classes[target],
                };
            }
            for p in writers {
                stack.extend(
                    self.reads[p]
                        .iter()
                        .filter(|&&r| self.tree[r].is_infinite()),
                );
            }
        }
        ExtractError::OnlyCyclic {
            target: self.classes[target],
        }
    }

    /// Whether `plan` (sorted, deduplicated) is a plan: every candidate usable, no class
    /// written twice, none computed twice or both computed and written, every read and
    /// target written, no cycle.
    fn is_plan(&self, plan: &[usize]) -> bool {
        let mut written = vec![false; self.classes.len()];
        for &p in plan {
            if p >= self.cost.len() {
                return false;
            }
            for &w in self.writes[p].iter().chain(&self.computes[p]) {
                if self.available[w] || std::mem::replace(&mut written[w], true) {
                    return false;
                }
            }
        }
        for &p in plan {
            for &c in &self.computes[p] {
                written[c] = false;
            }
        }
        let closed = plan
            .iter()
            .all(|&p| self.reads[p].iter().all(|&r| written[r]))
            && self.targets.iter().all(|&t| written[t]);
        closed && self.order(plan).len() == plan.len()
    }

    /// `plan` (a valid plan, sorted) improved by swaps until none helps (module docs, step
    /// 4): a candidate outside the plan whose reads the plan already writes replaces the
    /// chosen writers of its classes (which must write nothing else) when that, with the
    /// candidates whose writes nothing reads any more dropped, costs less. Sorted.
    fn improve(&self, plan: &[usize]) -> Vec<usize> {
        let mut plan = plan.to_vec();
        let mut state = SwapState::new(self, &plan);
        let mut changed = true;
        while changed {
            changed = false;
            for q in (0..self.cost.len()).filter(|&q| self.usable[q]) {
                let Some(removed) = state.try_swap(self, q) else {
                    continue;
                };
                let mut next: Vec<usize> = plan
                    .iter()
                    .copied()
                    .filter(|p| !removed.contains(p))
                    .chain([q])
                    .collect();
                next.sort_unstable();
                if self.is_plan(&next) {
                    state = SwapState::new(self, &next);
                    plan = next;
                    changed = true;
                }
            }
        }
        plan
    }

    /// Orders an acyclic plan producers first (Kahn's algorithm, lowest index first on ties).
    fn execution_order(&self, plan: &[usize]) -> Vec<usize> {
        let order = self.order(plan);
        debug_assert_eq!(order.len(), plan.len(), "extracted plan is cyclic");
        order
    }

    /// [`Model::execution_order`], shorter than `plan` where the plan has a cycle.
    fn order(&self, plan: &[usize]) -> Vec<usize> {
        let mut writer = vec![NONE; self.classes.len()];
        for &p in plan {
            for &w in &self.writes[p] {
                writer[w] = p;
            }
        }
        let mut waiting = vec![0; self.cost.len()];
        let mut consumers = vec![Vec::new(); self.cost.len()];
        for &p in plan {
            for &r in self.reads[p].iter().filter(|&&r| writer[r] != NONE) {
                waiting[p] += 1;
                consumers[writer[r]].push(p);
            }
        }
        let mut ready: BinaryHeap<_> = plan
            .iter()
            .filter(|&&p| waiting[p] == 0)
            .map(|&p| Reverse(p))
            .collect();
        let mut order = Vec::with_capacity(plan.len());
        while let Some(Reverse(p)) = ready.pop() {
            order.push(p);
            for &q in &consumers[p] {
                waiting[q] -= 1;
                if waiting[q] == 0 {
                    ready.push(Reverse(q));
                }
            }
        }
        order
    }
}

/// A plan's writers and readers, for [`Model::improve`]'s swaps.
struct SwapState {
    /// Per class: the plan's candidate writing it, or `NONE`.
    writer: Vec<usize>,
    /// Per class: how many of the plan's candidates read it, plus one for a target.
    readers: Vec<usize>,
    /// Per candidate: whether it is in the plan.
    chosen: Vec<bool>,
}

impl SwapState {
    fn new(m: &Model, plan: &[usize]) -> SwapState {
        let mut s = SwapState {
            writer: vec![NONE; m.classes.len()],
            readers: vec![0; m.classes.len()],
            chosen: vec![false; m.cost.len()],
        };
        for &t in &m.targets {
            s.readers[t] += 1;
        }
        for &p in plan {
            s.chosen[p] = true;
            for &w in &m.writes[p] {
                s.writer[w] = p;
            }
            for &r in &m.reads[p] {
                s.readers[r] += 1;
            }
        }
        s
    }

    /// The candidates that putting `q` in the plan removes (the writers of its classes,
    /// then those whose writes nothing reads any more), if they cost more than `q` and `q`
    /// fits: its reads written by candidates that stay, the writers it replaces writing
    /// nothing it does not. Leaves the state as it found it.
    fn try_swap(&mut self, m: &Model, q: usize) -> Option<Vec<usize>> {
        if self.chosen[q] {
            return None;
        }
        let mut removed: Vec<usize> = (m.writes[q].iter())
            .map(|&w| self.writer[w])
            .filter(|&p| p != NONE)
            .collect();
        removed.sort_unstable();
        removed.dedup();
        let fits = !removed.is_empty()
            && removed
                .iter()
                .all(|&p| m.writes[p].iter().all(|w| m.writes[q].contains(w)))
            && m.reads[q]
                .iter()
                .all(|&r| self.writer[r] != NONE && !removed.contains(&self.writer[r]));
        if !fits {
            return None;
        }
        // q's reads first, so that nothing it reads is dropped; then each removed
        // candidate's reads, dropping writers left with no reader.
        for &r in &m.reads[q] {
            self.readers[r] += 1;
        }
        let mut released = Vec::new();
        let mut next = 0;
        while let Some(&p) = removed.get(next) {
            next += 1;
            for &r in &m.reads[p] {
                self.readers[r] -= 1;
                released.push(r);
                let w = self.writer[r];
                if self.readers[r] == 0
                    && !removed.contains(&w)
                    && m.writes[w].iter().all(|&c| self.readers[c] == 0)
                {
                    removed.push(w);
                }
            }
        }
        // Undone, so that the state describes the plan again.
        for &r in &released {
            self.readers[r] += 1;
        }
        for &r in &m.reads[q] {
            self.readers[r] -= 1;
        }
        // A relative margin, so that sums rounded differently never swap back and forth.
        let saved: f64 = removed.iter().map(|&p| m.cost[p]).sum();
        (m.cost[q] * (1.0 + 1e-9) < saved).then_some(removed)
    }
}

/// One expanded search node: the class being resolved and the producer being tried.
struct Frame {
    class: usize,
    next: usize,
    cost: f64,
    bound: f64,
    taken: Option<usize>,
}

/// Branch-and-bound state (module docs, step 3). Explicit stack: depth grows with the
/// number of classes, too deep for recursion on large graphs.
struct Search<'a> {
    m: &'a Model,
    budget: Budget,
    deadline: Option<Instant>,
    /// Per class: the chosen candidate writing it, or `NONE`.
    writer: Vec<usize>,
    /// Per class: whether a chosen candidate computes it ([`Candidate::computes`]).
    computed: Vec<bool>,
    /// Per class: how many targets and chosen candidates need it.
    need: Vec<usize>,
    /// Needed, unwritten classes, and each one's position in it (`NONE` when absent).
    unresolved: Vec<usize>,
    pos: Vec<usize>,
    chosen: Vec<usize>,
    /// Epoch marks for the cycle walk, so it never clears per-class tables.
    seen: Vec<u32>,
    epoch: u32,
    walk: Vec<usize>,
    best: Option<(Vec<usize>, f64)>,
    second: Option<(Vec<usize>, f64)>,
    nodes: usize,
    exhausted: bool,
}

impl<'a> Search<'a> {
    fn new(m: &'a Model, budget: Budget, start: Instant) -> Self {
        let n = m.classes.len();
        let mut s = Search {
            m,
            budget,
            deadline: start.checked_add(budget.max_time),
            writer: vec![NONE; n],
            computed: vec![false; n],
            need: vec![0; n],
            unresolved: Vec::new(),
            pos: vec![NONE; n],
            chosen: Vec::new(),
            seen: vec![0; n],
            epoch: 0,
            walk: Vec::new(),
            best: None,
            second: None,
            nodes: 0,
            exhausted: false,
        };
        for &t in &m.targets {
            s.need_more(t);
        }
        s
    }

    fn add_unresolved(&mut self, c: usize) {
        self.pos[c] = self.unresolved.len();
        self.unresolved.push(c);
    }

    fn remove_unresolved(&mut self, c: usize) {
        let i = std::mem::replace(&mut self.pos[c], NONE);
        self.unresolved.swap_remove(i);
        if let Some(&moved) = self.unresolved.get(i) {
            self.pos[moved] = i;
        }
    }

    fn need_more(&mut self, c: usize) {
        self.need[c] += 1;
        if self.need[c] == 1 && self.writer[c] == NONE {
            self.add_unresolved(c);
        }
    }

    fn choose(&mut self, p: usize) {
        for &w in &self.m.writes[p] {
            self.writer[w] = p;
            if self.pos[w] != NONE {
                self.remove_unresolved(w);
            }
        }
        for &r in &self.m.reads[p] {
            self.need_more(r);
        }
        for &c in &self.m.computes[p] {
            self.computed[c] = true;
        }
        self.chosen.push(p);
    }

    fn unchoose(&mut self, p: usize) {
        self.chosen.pop();
        for &c in &self.m.computes[p] {
            self.computed[c] = false;
        }
        for &r in &self.m.reads[p] {
            self.need[r] -= 1;
            if self.need[r] == 0 && self.pos[r] != NONE {
                self.remove_unresolved(r);
            }
        }
        for &w in &self.m.writes[p] {
            self.writer[w] = NONE;
            if self.need[w] > 0 {
                self.add_unresolved(w);
            }
        }
    }

    /// The greedy plan (module docs, step 2), sorted; `None` when single-writer conflicts
    /// or cycles leave a needed class without a producer, and only the search can find one.
    /// Leaves the search state as it found it.
    fn greedy(&mut self, producers: &[Vec<usize>]) -> Option<Vec<usize>> {
        let m = self.m;
        // Consumers before producers: a multi-output producer picked for a consumer's input
        // then covers its other outputs instead of duplicating them. Reads are mostly
        // unwritten when their consumer is chosen, so the cycle walks stay short.
        let mut heap: BinaryHeap<(usize, usize)> =
            self.unresolved.iter().map(|&c| (m.rank[c], c)).collect();
        let mut complete = true;
        while let Some((_, c)) = heap.pop() {
            if self.writer[c] != NONE {
                continue;
            }
            let mut usable = producers[c].iter().copied();
            let Some(p) = usable.find(|&p| self.fits(p) && !self.closes_cycle(p)) else {
                complete = false;
                break;
            };
            self.choose(p);
            heap.extend(
                m.reads[p]
                    .iter()
                    .filter(|&&r| self.writer[r] == NONE)
                    .map(|&r| (m.rank[r], r)),
            );
        }
        let plan = complete.then(|| {
            let mut plan = self.chosen.clone();
            plan.sort_unstable();
            plan
        });
        while let Some(&p) = self.chosen.last() {
            self.unchoose(p);
        }
        plan
    }

    /// No class `p` writes is written or computed yet, and no class it computes is written,
    /// computed or needed (a needed class must be written).
    fn fits(&self, p: usize) -> bool {
        self.m.writes[p]
            .iter()
            .all(|&w| self.writer[w] == NONE && !self.computed[w])
            && self.m.computes[p]
                .iter()
                .all(|&c| self.writer[c] == NONE && !self.computed[c] && self.need[c] == 0)
    }

    /// Would choosing `p` close a cycle? Only if its reads reach its writes through the
    /// chosen writers, since every cycle through `p` leaves by a read and returns by a write.
    fn closes_cycle(&mut self, p: usize) -> bool {
        self.epoch += 1;
        let epoch = self.epoch;
        self.walk.clear();
        self.walk.extend_from_slice(&self.m.reads[p]);
        while let Some(c) = self.walk.pop() {
            if self.m.writes[p].contains(&c) {
                return true;
            }
            if self.seen[c] == epoch || self.writer[c] == NONE {
                continue;
            }
            self.seen[c] = epoch;
            self.walk.extend_from_slice(&self.m.reads[self.writer[c]]);
        }
        false
    }

    /// Offers the best plan so far improved by swaps ([`Model::improve`]).
    fn improve_best(&mut self) {
        if let Some((best, cost)) = &self.best {
            let improved = self.m.improve(best);
            if improved != *best {
                let now: f64 = improved.iter().map(|&p| self.m.cost[p]).sum();
                tracing::debug!(target: "tessel::plan", "swaps took the plan from {cost:?} s to {now:?} s");
                self.offer(improved);
            }
        }
    }

    /// Keeps `plan` (sorted candidate indices) if it is among the two cheapest distinct plans.
    fn offer(&mut self, plan: Vec<usize>) {
        let is = |kept: &Option<(Vec<usize>, f64)>| kept.as_ref().is_some_and(|k| k.0 == plan);
        if is(&self.best) || is(&self.second) {
            return;
        }
        let cost: f64 = plan.iter().map(|&p| self.m.cost[p]).sum();
        if self.best.as_ref().is_none_or(|b| cost < b.1) {
            self.second = self.best.replace((plan, cost));
        } else if self.second.as_ref().is_none_or(|s| cost < s.1) {
            self.second = Some((plan, cost));
        }
    }

    /// A node must beat the second plan kept to change the top two.
    fn threshold(&self) -> f64 {
        self.second.as_ref().map_or(f64::INFINITY, |s| s.1)
    }

    fn out_of_budget(&mut self) -> bool {
        // Reading the clock every node would cost more than the node itself.
        if self.nodes >= self.budget.max_nodes
            || (self.nodes.is_multiple_of(64) && self.deadline.is_none_or(|d| Instant::now() >= d))
        {
            self.exhausted = true;
        }
        self.exhausted
    }

    /// Expands the current partial plan: records it if complete, returns its frame if worth
    /// branching on.
    fn expand(&mut self, cost: f64) -> Option<Frame> {
        if self.out_of_budget() {
            return None;
        }
        self.nodes += 1;
        let (mut class, mut bound) = (NONE, 0.0);
        for &c in &self.unresolved {
            bound += self.m.share[c];
            if class == NONE || self.m.rank[c] > self.m.rank[class] {
                class = c;
            }
        }
        if class == NONE {
            let mut plan = self.chosen.clone();
            plan.sort_unstable();
            self.offer(plan);
            return None;
        }
        (cost + bound < self.threshold()).then_some(Frame {
            class,
            next: 0,
            cost,
            bound,
            taken: None,
        })
    }

    /// Can `p` extend the frame's plan, and might the result beat the threshold?
    fn admits(&mut self, p: usize, cost: f64, bound: f64) -> bool {
        if !self.fits(p) {
            return false;
        }
        // Children's bound is at least this: p's writes leave the frontier, its reads may join.
        let freed: f64 = self.m.writes[p]
            .iter()
            .filter(|&&w| self.pos[w] != NONE)
            .map(|&w| self.m.share[w])
            .sum();
        cost + self.m.cost[p] + (bound - freed) < self.threshold() && !self.closes_cycle(p)
    }

    fn run(&mut self) {
        let m = self.m;
        let mut stack: Vec<Frame> = self.expand(0.0).into_iter().collect();
        while let Some(top) = stack.last_mut() {
            if let Some(p) = top.taken.take() {
                self.unchoose(p);
            }
            if self.exhausted {
                break;
            }
            let mut child = None;
            let producers = &m.producers[top.class];
            while let Some(&p) = producers.get(top.next) {
                top.next += 1;
                if self.admits(p, top.cost, top.bound) {
                    self.choose(p);
                    top.taken = Some(p);
                    child = Some(self.expand(top.cost + m.cost[p]));
                    break;
                }
            }
            match child {
                None => drop(stack.pop()),
                Some(Some(frame)) => stack.push(frame),
                // A leaf or a pruned child: the next turn undoes `taken` and moves on.
                Some(None) => {}
            }
        }
    }
}
