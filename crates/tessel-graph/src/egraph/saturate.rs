//! Equality saturation: apply every rule everywhere, rebuild, repeat, within a budget.
//!
//! Each iteration searches all rules against the same e-graph, then applies every match
//! (adding its form and merging it into the matched class), then rebuilds. It stops when an
//! iteration changes nothing (saturated) or a budget runs out; the e-graph is rebuilt (its
//! invariants hold) whenever it stops.

use std::time::{Duration, Instant};

use tracing::debug;

use super::{EGraph, Match, Rewrite};

/// Limits on saturation. Whichever runs out first stops it; the e-graph is valid either
/// way, only less explored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Iterations (search all rules, apply all matches, rebuild).
    pub iterations: usize,
    /// E-nodes: applying stops once the e-graph holds this many. The count is absolute:
    /// an e-graph that starts this large is not rewritten at all, so scale it with the
    /// graph (a few times its node count).
    pub nodes: usize,
    /// Wall-clock time, checked between rules and every few hundred matches.
    pub time: Duration,
}

impl Default for Budget {
    /// 30 iterations, 10 000 e-nodes, 100 ms: plenty for the built-in rules, which mostly
    /// shrink graphs, on graphs of thousands of nodes.
    fn default() -> Self {
        Budget {
            iterations: 30,
            nodes: 10_000,
            time: Duration::from_millis(100),
        }
    }
}

/// Why saturation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An iteration changed nothing: every rule's every match is already in the e-graph.
    Saturated,
    /// [`Budget::iterations`] ran out.
    IterationLimit,
    /// [`Budget::nodes`] was reached.
    NodeLimit,
    /// [`Budget::time`] ran out.
    TimeLimit,
}

/// What saturation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SaturationReport {
    /// Iterations started.
    pub iterations: usize,
    /// E-nodes at the end.
    pub nodes: usize,
    /// Classes at the end.
    pub classes: usize,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// Per rule, in the order given: how many matches changed the e-graph (added an
    /// e-node or merged two classes).
    pub applied: Vec<(&'static str, usize)>,
    /// Wall-clock time spent.
    pub elapsed: Duration,
}

impl SaturationReport {
    /// How many times the rule named `name` changed the e-graph (0 if it is not there).
    pub fn applied(&self, name: &str) -> usize {
        self.applied
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |&(_, k)| k)
    }
}

/// Matches applied between two checks of the clock.
const TIME_CHECK_EVERY: usize = 256;

/// E-graphs of at least this many e-nodes are searched on several threads.
const PARALLEL_SEARCH_MIN_NODES: usize = 2048;

/// Each rule's matches, in the rules' order. Searching only reads the e-graph, so on a
/// large one the rules are searched on several threads (rule `i` on thread `i mod n`).
fn search_rules(egraph: &EGraph, rules: &[Rewrite]) -> Vec<Vec<Match>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(rules.len());
    if threads < 2 || egraph.n_nodes() < PARALLEL_SEARCH_MIN_NODES {
        return rules.iter().map(|r| r.search(egraph)).collect();
    }
    let mut per_thread: Vec<Vec<Vec<Match>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    rules
                        .iter()
                        .skip(t)
                        .step_by(threads)
                        .map(|r| r.search(egraph))
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    (0..rules.len())
        .map(|i| std::mem::take(&mut per_thread[i % threads][i / threads]))
        .collect()
}

impl EGraph {
    /// Applies `rules` until nothing changes or `budget` runs out. See the module docs of
    /// `saturate.rs` for the loop; [`SaturationReport::applied`] counts per rule.
    pub fn saturate(&mut self, rules: &[Rewrite], budget: Budget) -> SaturationReport {
        let start = Instant::now();
        self.rebuild();
        let mut applied = vec![0usize; rules.len()];
        let mut iterations = 0;
        let stop_reason = loop {
            if iterations >= budget.iterations {
                break StopReason::IterationLimit;
            }
            if self.n_nodes() >= budget.nodes {
                break StopReason::NodeLimit;
            }
            if start.elapsed() >= budget.time {
                break StopReason::TimeLimit;
            }
            iterations += 1;
            let mut stop = None;
            let matches = search_rules(self, rules);
            if start.elapsed() >= budget.time {
                stop = Some(StopReason::TimeLimit);
            }
            let n_matches: usize = matches.iter().map(Vec::len).sum();
            let mut changed = false;
            let mut since_check = 0;
            'apply: for (i, rule_matches) in matches.iter().enumerate() {
                for m in rule_matches {
                    let nodes_before = self.n_nodes();
                    let Some(class) = rules[i].apply(self, m) else {
                        continue;
                    };
                    let merged = self.union(m.class, class);
                    if merged || self.n_nodes() != nodes_before {
                        applied[i] += 1;
                        changed = true;
                    }
                    if self.n_nodes() >= budget.nodes {
                        stop = Some(StopReason::NodeLimit);
                        break 'apply;
                    }
                    since_check += 1;
                    if since_check == TIME_CHECK_EVERY {
                        since_check = 0;
                        if start.elapsed() >= budget.time {
                            stop = Some(StopReason::TimeLimit);
                            break 'apply;
                        }
                    }
                }
            }
            let congruences = self.rebuild();
            debug!(
                target: "tessel::egraph",
                iteration = iterations,
                matches = n_matches,
                congruences,
                nodes = self.n_nodes(),
                classes = self.n_classes(),
                "saturation iteration"
            );
            if let Some(reason) = stop {
                break reason;
            }
            if !changed {
                break StopReason::Saturated;
            }
        };
        let report = SaturationReport {
            iterations,
            nodes: self.n_nodes(),
            classes: self.n_classes(),
            stop_reason,
            applied: rules.iter().map(Rewrite::name).zip(applied).collect(),
            elapsed: start.elapsed(),
        };
        debug!(
            target: "tessel::egraph",
            iterations = report.iterations,
            nodes = report.nodes,
            classes = report.classes,
            stop_reason = ?report.stop_reason,
            elapsed = ?report.elapsed,
            applied = ?report.applied.iter().filter(|(_, k)| *k > 0).collect::<Vec<_>>(),
            "saturation done"
        );
        report
    }
}
