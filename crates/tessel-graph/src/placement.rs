//! Placement: extraction over several devices, with transfers.
//!
//! Each candidate runs on one device, where its program was compiled and measured. A value
//! produced on one device and read on another needs a copy, a candidate of its own whose
//! cost is the measured copy time. [`place`] turns such a problem into an
//! [`extract::Problem`] over (value, device) classes — one class per value per device, a
//! transfer candidate between two of them — so the one extraction algorithm chooses
//! kernels, devices and copies together: a transfer is in a plan only where a chosen
//! producer and a chosen consumer live on different devices.
//!
//! Device 0 is the *home* device: the available values (the realize's inputs) live there
//! and the targets must end there.

use crate::extract::{self, Budget, ClassId, ExtractError};

/// A program measured on one device.
#[derive(Clone, Debug, PartialEq)]
pub struct PlacedCandidate {
    /// The caller's identifier; opaque here.
    pub id: usize,
    /// The device it runs on (an index, 0 = home).
    pub device: usize,
    /// The values it writes, on its device.
    pub writes: Vec<ClassId>,
    /// The values it reads, on its device.
    pub reads: Vec<ClassId>,
    /// The values it computes only for itself that a plan computes once
    /// ([`extract::Candidate::computes`]), on any device.
    pub computes: Vec<ClassId>,
    /// Measured seconds.
    pub cost: f64,
}

/// A measured copy of a value from one device to another.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transfer {
    /// The value.
    pub class: ClassId,
    /// Source device.
    pub from: usize,
    /// Destination device.
    pub to: usize,
    /// Measured seconds.
    pub cost: f64,
}

/// A placement problem.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// How many devices (at least 1; 0 is home).
    pub devices: usize,
    /// Every program on every device.
    pub candidates: Vec<PlacedCandidate>,
    /// Every copy that was measured; a value with no transfer cannot move.
    pub transfers: Vec<Transfer>,
    /// Values available on the home device.
    pub available: Vec<ClassId>,
    /// Values wanted on the home device.
    pub targets: Vec<ClassId>,
}

/// One step of a placed plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Run the candidate with this [`PlacedCandidate::id`].
    Run(usize),
    /// Copy a value between devices.
    Copy {
        /// The value.
        class: ClassId,
        /// Source device.
        from: usize,
        /// Destination device.
        to: usize,
    },
}

/// The result of [`place`].
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    /// The steps in a valid order (producers and copies before their readers).
    pub steps: Vec<Step>,
    /// Total measured cost.
    pub cost: f64,
    /// The second-best plan, as steps, and its cost.
    pub runner_up: Option<(Vec<Step>, f64)>,
    /// The search budget ran out.
    pub exhausted: bool,
}

/// The cheapest closed plan of `problem` (see the module docs); errors name values as the
/// caller numbered them.
pub fn place(problem: &Placement, budget: Budget) -> Result<Placed, ExtractError> {
    place_from(problem, budget, &[])
}

/// [`place`], also starting from `known`, a plan of candidates (by
/// [`PlacedCandidate::id`]) on their own devices with no copies that the caller knows to
/// be valid: the result is never worse than it (see [`extract::extract_from`]).
pub fn place_from(
    problem: &Placement,
    budget: Budget,
    known: &[usize],
) -> Result<Placed, ExtractError> {
    let devices = problem.devices.max(1) as u32;
    let at = |c: ClassId, device: usize| ClassId(c.0 * devices + device as u32);
    let mut candidates: Vec<extract::Candidate> = problem
        .candidates
        .iter()
        .map(|c| extract::Candidate {
            id: 0,
            writes: c.writes.iter().map(|&w| at(w, c.device)).collect(),
            reads: c.reads.iter().map(|&r| at(r, c.device)).collect(),
            // Once on any device: a copy carries one computation's bits.
            computes: c
                .computes
                .iter()
                .flat_map(|&v| (0..devices as usize).map(move |d| at(v, d)))
                .collect(),
            cost: c.cost,
        })
        .collect();
    candidates.extend(problem.transfers.iter().map(|t| extract::Candidate {
        id: 0,
        writes: vec![at(t.class, t.to)],
        reads: vec![at(t.class, t.from)],
        computes: Vec::new(),
        cost: t.cost,
    }));
    // Extraction's ids are positions here: candidates first, then transfers.
    for (i, c) in candidates.iter_mut().enumerate() {
        c.id = i;
    }
    let encoded = extract::Problem {
        candidates,
        available: problem.available.iter().map(|&c| at(c, 0)).collect(),
        targets: problem.targets.iter().map(|&c| at(c, 0)).collect(),
    };
    let class = |c: ClassId| ClassId(c.0 / devices);
    // Extraction's ids are positions: the known plan's candidates by position.
    let known: Vec<usize> = known
        .iter()
        .filter_map(|&id| problem.candidates.iter().position(|c| c.id == id))
        .collect();
    let extraction = extract::extract_from(&encoded, budget, &known).map_err(|e| match e {
        ExtractError::NoProducer { class: c, target } => ExtractError::NoProducer {
            class: class(c),
            target: class(target),
        },
        ExtractError::OnlyCyclic { target } => ExtractError::OnlyCyclic {
            target: class(target),
        },
        ExtractError::NoValidPlan { targets, exhausted } => ExtractError::NoValidPlan {
            targets: targets.into_iter().map(class).collect(),
            exhausted,
        },
        ExtractError::InvalidCost { id, cost } => ExtractError::InvalidCost {
            id: problem.candidates.get(id).map_or(id, |c| c.id),
            cost,
        },
    })?;
    let n = problem.candidates.len();
    let steps = |chosen: &[usize]| -> Vec<Step> {
        chosen
            .iter()
            .map(|&k| {
                if k < n {
                    Step::Run(problem.candidates[k].id)
                } else {
                    let t = problem.transfers[k - n];
                    Step::Copy {
                        class: t.class,
                        from: t.from,
                        to: t.to,
                    }
                }
            })
            .collect()
    };
    Ok(Placed {
        steps: steps(&extraction.chosen),
        cost: extraction.cost,
        runner_up: extraction
            .runner_up
            .as_ref()
            .map(|(chosen, cost)| (steps(chosen), *cost)),
        exhausted: extraction.exhausted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: usize, device: usize, reads: &[u32], writes: &[u32], cost: f64) -> PlacedCandidate {
        PlacedCandidate {
            id,
            device,
            writes: writes.iter().map(|&c| ClassId(c)).collect(),
            reads: reads.iter().map(|&c| ClassId(c)).collect(),
            computes: Vec::new(),
            cost,
        }
    }

    /// Copies of every value both ways at `cost`.
    fn transfers(classes: &[u32], cost: f64) -> Vec<Transfer> {
        classes
            .iter()
            .flat_map(|&c| {
                [(0, 1), (1, 0)].map(|(from, to)| Transfer {
                    class: ClassId(c),
                    from,
                    to,
                    cost,
                })
            })
            .collect()
    }

    /// Input `c0` on home; `c1 = f(c0)`, `c2 = g(c1)` wanted on home.
    fn chain(f: [f64; 2], g: [f64; 2], copy: f64) -> Placement {
        Placement {
            devices: 2,
            candidates: vec![
                run(10, 0, &[0], &[1], f[0]),
                run(11, 1, &[0], &[1], f[1]),
                run(20, 0, &[1], &[2], g[0]),
                run(21, 1, &[1], &[2], g[1]),
            ],
            transfers: transfers(&[0, 1, 2], copy),
            available: vec![ClassId(0)],
            targets: vec![ClassId(2)],
        }
    }

    fn copy(class: u32, from: usize, to: usize) -> Step {
        Step::Copy {
            class: ClassId(class),
            from,
            to,
        }
    }

    #[test]
    fn one_device_needs_no_transfers() {
        let placed = place(&chain([1.0, 9.0], [1.0, 9.0], 0.5), Budget::default()).unwrap();
        assert_eq!(placed.steps, vec![Step::Run(10), Step::Run(20)]);
        assert_eq!(placed.cost, 2.0);
    }

    #[test]
    fn a_faster_device_pays_for_its_copies() {
        // Both kernels much faster on device 1: copy the input there and the result back.
        let placed = place(&chain([5.0, 1.0], [5.0, 1.0], 0.5), Budget::default()).unwrap();
        assert_eq!(
            placed.steps,
            vec![copy(0, 0, 1), Step::Run(11), Step::Run(21), copy(2, 1, 0)]
        );
        assert_eq!(placed.cost, 3.0);
        // Copies too dear: everything stays home.
        let placed = place(&chain([5.0, 1.0], [5.0, 1.0], 10.0), Budget::default()).unwrap();
        assert_eq!(placed.steps, vec![Step::Run(10), Step::Run(20)]);
    }

    #[test]
    fn a_transfer_sits_exactly_where_producer_and_consumer_differ() {
        // f is fast on device 1, g at home: one copy in, one copy between them.
        let placed = place(&chain([5.0, 1.0], [1.0, 5.0], 0.5), Budget::default()).unwrap();
        assert_eq!(
            placed.steps,
            vec![copy(0, 0, 1), Step::Run(11), copy(1, 1, 0), Step::Run(20)]
        );
        assert_eq!(placed.cost, 3.0);
    }

    #[test]
    fn a_value_without_a_measured_copy_never_moves() {
        let mut problem = chain([5.0, 1.0], [5.0, 1.0], 0.5);
        problem.transfers.retain(|t| t.class != ClassId(0));
        let placed = place(&problem, Budget::default()).unwrap();
        // f runs at home, where its input is; g is still worth moving.
        assert_eq!(
            placed.steps,
            vec![Step::Run(10), copy(1, 0, 1), Step::Run(21), copy(2, 1, 0)]
        );
    }

    #[test]
    fn errors_name_the_callers_values() {
        let problem = Placement {
            devices: 2,
            candidates: vec![run(1, 1, &[5], &[2], 1.0)],
            transfers: vec![],
            available: vec![],
            targets: vec![ClassId(2)],
        };
        let err = place(&problem, Budget::default()).unwrap_err();
        assert!(
            matches!(err, ExtractError::NoProducer { target, .. } if target == ClassId(2)),
            "{err:?}"
        );
    }
}
