//! Views: a chain of reshapes, permutes and shrinks over a value read as element offsets
//! of that value's contiguous buffer, so a routine can read the view in place instead of a
//! copy of it (heads split out of a projection's rows, `x.view(b, l, h, e).transpose(1,
//! 2)`, are such a view).

use tessel_shape::Dim;

use crate::graph::{Graph, NodeId, Op};

/// A node read in place: element `c` (a coordinate of the node) is element `offset + Σ c[a]
/// · strides[a]` of `base`'s row-major buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StridedView {
    /// The value whose buffer holds the elements: the first node below the chain that is
    /// not a reshape, permute or shrink.
    pub base: NodeId,
    /// The element of `base` at the node's first coordinate.
    pub offset: Dim,
    /// Elements of `base` per step along each of the node's axes.
    pub strides: Vec<Dim>,
}

/// `node` as a [`StridedView`] of the value below its chain of reshapes, permutes and
/// shrinks (itself, with row-major strides, where it has none); `None` where a reshape
/// regroups axes whose elements are not evenly spaced, or splits or merges symbolic sizes.
pub fn strided_view(graph: &Graph, node: NodeId) -> Option<StridedView> {
    let mut chain = Vec::new();
    let mut base = node;
    while let Op::Reshape(inner) | Op::Permute(inner, _) | Op::Shrink(inner, _) =
        &graph.node(base).op
    {
        chain.push(base);
        base = *inner;
    }
    let mut strides = graph.node(base).shape.contiguous_strides();
    let mut offset = Dim::constant(0);
    for &n in chain.iter().rev() {
        let node = graph.node(n);
        strides = match &node.op {
            Op::Reshape(inner) => {
                reshaped(graph.node(*inner).shape.dims(), &strides, node.shape.dims())?
            }
            Op::Permute(_, perm) => perm.iter().map(|&p| strides[p]).collect(),
            Op::Shrink(_, ranges) => {
                for ((start, _), stride) in ranges.iter().zip(&strides) {
                    offset += *start * *stride;
                }
                ranges
                    .iter()
                    .zip(&strides)
                    .map(|((_, step), s)| *step * *s)
                    .collect()
            }
            _ => unreachable!("the chain holds reshapes, permutes and shrinks"),
        };
    }
    Some(StridedView {
        base,
        offset,
        strides,
    })
}

/// The strides of a reshape to `new` of a view of sizes `old` and strides `strides`, or
/// `None` where some group of axes it merges or splits is not evenly spaced, or has
/// symbolic sizes that differ (a size-1 axis gets stride 0).
fn reshaped(old: &[Dim], strides: &[Dim], new: &[Dim]) -> Option<Vec<Dim>> {
    let one = Dim::constant(1);
    let old: Vec<(Dim, Dim)> = old
        .iter()
        .zip(strides)
        .filter(|(d, _)| **d != one)
        .map(|(d, s)| (*d, *s))
        .collect();
    let kept: Vec<usize> = (0..new.len()).filter(|&a| new[a] != one).collect();
    let mut out = vec![Dim::constant(0); new.len()];
    let (mut i, mut j) = (0, 0);
    while i < old.len() && j < kept.len() {
        // One group: the old axes `i..i2` hold the elements of the new axes `j..j2`.
        let (mut i2, mut j2) = (i + 1, j + 1);
        if old[i].0 != new[kept[j]] {
            let (mut a, mut b) = (old[i].0.as_const()?, new[kept[j]].as_const()?);
            while a != b {
                if a < b {
                    a = a.checked_mul(old.get(i2)?.0.as_const()?)?;
                    i2 += 1;
                } else {
                    b = b.checked_mul(new[*kept.get(j2)?].as_const()?)?;
                    j2 += 1;
                }
            }
        }
        // The old axes of a group must chain: each outer step a whole run of the inner.
        for a in i..i2 - 1 {
            if old[a].1 != old[a + 1].1 * old[a + 1].0 {
                return None;
            }
        }
        let mut stride = old[i2 - 1].1;
        for &a in kept[j..j2].iter().rev() {
            out[a] = stride;
            stride *= new[a];
        }
        (i, j) = (i2, j2);
    }
    (i == old.len() && j == kept.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use tessel_shape::{DType, Dim, Shape, Var};

    use super::{StridedView, strided_view};
    use crate::graph::{Graph, LeafId, Node, Op};

    fn add(g: &mut Graph, op: Op, dims: Vec<Dim>) -> crate::NodeId {
        g.add(Node {
            op,
            dtype: DType::F32,
            shape: Shape::new(dims),
        })
    }

    /// GPT-2's keys: `qkv.split(768, -1)[1].view(b, l, 12, 64).transpose(1, 2)` over a
    /// `[b, l, 2304]` buffer, with a symbolic length.
    #[test]
    fn heads_split_out_of_a_projection_are_read_in_place() {
        let l = Dim::from(Var::new("l", 1, 1024).unwrap());
        let c = Dim::constant;
        let mut g = Graph::new();
        let qkv = add(&mut g, Op::Leaf(LeafId(0)), vec![c(2), l, c(2304)]);
        let ranges = [(c(0), c(1)), (c(0), c(1)), (c(768), c(1))];
        let k = add(
            &mut g,
            Op::Shrink(qkv, ranges.into()),
            vec![c(2), l, c(768)],
        );
        let k = add(&mut g, Op::Reshape(k), vec![c(2), l, c(12), c(64)]);
        let k = add(
            &mut g,
            Op::Permute(k, [0, 2, 1, 3].into()),
            vec![c(2), c(12), l, c(64)],
        );
        assert_eq!(
            strided_view(&g, k),
            Some(StridedView {
                base: qkv,
                offset: c(768),
                strides: vec![l * c(2304), c(64), c(2304), c(1)],
            })
        );
        // The heads merged back: `[b, l, 12, 64]` → `[b, l, 768]` of a permuted value.
        let merged = add(
            &mut g,
            Op::Permute(k, [0, 2, 1, 3].into()),
            vec![c(2), l, c(12), c(64)],
        );
        let merged = add(&mut g, Op::Reshape(merged), vec![c(2), l, c(768)]);
        assert_eq!(
            strided_view(&g, merged).map(|v| v.strides),
            Some(vec![l * c(2304), c(2304), c(1)])
        );
        // Batch and heads merged do not chain (a batch step is not 12 heads' worth).
        let t = add(&mut g, Op::Reshape(k), vec![c(24), l, c(64)]);
        assert_eq!(strided_view(&g, t), None);
    }
}
