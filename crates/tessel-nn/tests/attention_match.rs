//! Which attentions the graph layer finds (`tessel_graph::find_attention` on graphs that
//! `scaled_dot_product_attention` and hand-written code record): causal or not, in `f32`
//! and between the casts of `bf16`, with the recorded scale, grouped-query heads read
//! unrepeated, additive and boolean masks read in place; the backward's pieces, the key
//! gradient in both layouts.

use tessel_graph::egraph::{Budget, forms};
use tessel_graph::{find_attention, find_matmuls};
use tessel_ir::{Attention, AttentionPart, VendorOp};
use tessel_nn::scaled_dot_product_attention;
use tessel_tensor::{DType, Dim, Result, Tensor, inspect};

/// The attentions writing `y`'s node.
fn attentions_writing(y: &Tensor) -> Vec<Attention> {
    let (graph, targets) = inspect::graph_of(&[y]);
    let order = graph.toposort(&targets);
    let matmuls = find_matmuls(&graph, &order);
    find_attention(&graph, &order, &matmuls)
        .into_iter()
        .filter(|m| m.writes.contains(&targets[0]))
        .filter_map(|m| match m.op {
            VendorOp::Attention(a) => Some(a),
            VendorOp::Matmul(_) | VendorOp::AttentionBackward(_) => None,
        })
        .collect()
}

fn qkv(dtype: DType) -> Result<[Tensor; 3]> {
    let q = Tensor::randn([2, 3, 5, 4], dtype)?;
    let k = Tensor::randn([2, 3, 7, 4], dtype)?;
    let v = Tensor::randn([2, 3, 7, 6], dtype)?;
    Tensor::realize_all(&[&q, &k, &v])?;
    Ok([q, k, v])
}

#[test]
fn sdpa_is_one_attention_causal_or_not_in_f32_and_bf16() -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        for causal in [false, true] {
            let [q, k, v] = qkv(dtype)?;
            let y = scaled_dot_product_attention(&q, &k, &v, None, 0.0, causal, None, false)?;
            let found = attentions_writing(&y);
            assert_eq!(found.len(), 1, "{dtype} causal {causal}: {found:?}");
            let a = &found[0];
            let d = |v: i64| Dim::constant(v);
            assert_eq!(
                (a.dtype, a.batch, a.l, a.s, a.e, a.ev, a.causal),
                (dtype, d(6), d(5), d(7), d(4), d(6), causal),
                "{a}"
            );
            assert_eq!(
                (a.q_batch_stride, a.k_batch_stride, a.v_batch_stride),
                (d(20), d(28), d(42))
            );
            assert_eq!(a.scale.to_f64(), 0.5, "1/√4");
            assert_eq!(a.kv_group, d(1));
        }
    }
    Ok(())
}

#[test]
fn grouped_query_heads_are_read_unrepeated() -> Result<()> {
    let q = Tensor::randn([2, 4, 5, 8], DType::BF16)?;
    let k = Tensor::randn([2, 2, 7, 8], DType::BF16)?;
    let v = Tensor::randn([2, 2, 7, 8], DType::BF16)?;
    Tensor::realize_all(&[&q, &k, &v])?;
    let y = scaled_dot_product_attention(&q, &k, &v, None, 0.0, true, None, true)?;
    let (graph, targets) = inspect::graph_of(&[&y]);
    let order = graph.toposort(&targets);
    let matmuls = find_matmuls(&graph, &order);
    let found = find_attention(&graph, &order, &matmuls);
    assert_eq!(found.len(), 1, "{found:?}");
    let VendorOp::Attention(a) = &found[0].op else {
        panic!("{:?}", found[0].op)
    };
    assert_eq!(
        (a.batch, a.kv_group),
        (Dim::constant(8), Dim::constant(2)),
        "{a}"
    );
    assert_eq!(a.k_batch_stride, Dim::constant(56));
    // k and v themselves, not their repeats.
    for (operand, name) in found[0].operands[1..].iter().zip(["k", "v"]) {
        assert!(
            matches!(graph.node(*operand).op, tessel_graph::Op::Leaf(_)),
            "{name} is read through {:?}",
            graph.node(*operand).op
        );
    }
    Ok(())
}

/// GPT-2's attention: q, k and v split out of one `[b, l, 3·h·e]` projection and viewed
/// as heads, the output's heads merged back. Besides the match over copies of q, k and v,
/// one reads their rows in place and writes the merged output.
#[test]
fn heads_split_out_of_a_projection_are_read_in_place() -> Result<()> {
    let (b, l, h, e) = (2usize, 5usize, 3usize, 4usize);
    // A computed projection (not a leaf): it must be materialized to be read in place.
    let x = Tensor::randn([b, l, 3 * h * e], DType::BF16)?;
    let qkv = x.exp();
    let heads = |j: usize| -> Result<Tensor> {
        qkv.narrow(2, (j * h * e) as i64, (h * e) as i64)?
            .reshape(&[b as i64, l as i64, h as i64, e as i64])?
            .transpose(1, 2)
    };
    let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
    let y = scaled_dot_product_attention(&q, &k, &v, None, 0.0, true, None, false)?
        .transpose(1, 2)?
        .reshape(&[b as i64, l as i64, (h * e) as i64])?;
    let (graph, targets) = inspect::graph_of(&[&y]);
    let order = graph.toposort(&targets);
    let matmuls = find_matmuls(&graph, &order);
    let found = find_attention(&graph, &order, &matmuls);
    let in_place: Vec<_> = found
        .iter()
        .filter(|m| matches!(&m.op, VendorOp::Attention(a) if a.layout.is_some()))
        .collect();
    assert_eq!((found.len(), in_place.len()), (2, 1), "{found:?}");
    let m = in_place[0];
    let VendorOp::Attention(a) = &m.op else {
        unreachable!()
    };
    let layout = a.layout.as_ref().unwrap();
    let d = |v: usize| Dim::constant(v as i64);
    let row = d(3 * h * e);
    assert_eq!(layout.heads, d(h));
    assert_eq!(layout.q, [d(0), d(l) * row, d(e), row]);
    assert_eq!(layout.k, [d(h * e), d(l) * row, d(e), row]);
    assert_eq!(layout.v, [d(2 * h * e), d(l) * row, d(e), row]);
    assert_eq!(layout.out, [d(0), d(l * h * e), d(e), d(h * e)]);
    // All three read the projection; the output's merged heads are written.
    let base = m.operands[0];
    assert_eq!(m.operands, vec![base; 3]);
    assert_eq!(graph.node(base).shape.dims(), [d(b), d(l), d(3 * h * e)]);
    assert!(m.writes.contains(&targets[0]), "{m:?}");
    // Differentiated, the attention keeps its contiguous operands (the backward reads
    // them so): no match in place.
    let loss = y.cast(DType::F32).sum_all()?;
    let grads = tessel_tensor::grad(&loss, &[&x])?;
    let (graph, targets) = inspect::graph_of(&[&y, &grads[0]]);
    let order = graph.toposort(&targets);
    let found = find_attention(&graph, &order, &find_matmuls(&graph, &order));
    assert!(
        found
            .iter()
            .any(|m| matches!(m.op, VendorOp::AttentionBackward(_))),
        "{found:?}"
    );
    assert!(
        !found
            .iter()
            .any(|m| matches!(&m.op, VendorOp::Attention(a) if a.layout.is_some())),
        "{found:?}"
    );
    Ok(())
}

#[test]
fn hand_written_attention_without_a_scale_has_scale_one() -> Result<()> {
    let [q, k, v] = qkv(DType::F32)?;
    let y = q.matmul(&k.transpose(-2, -1)?)?.softmax(-1)?.matmul(&v)?;
    let found = attentions_writing(&y);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].scale.to_f64(), 1.0);
    assert!(!found[0].causal);
    Ok(())
}

#[test]
fn additive_masks_are_read_in_place_with_broadcast_strides() -> Result<()> {
    let d = |v: i64| Dim::constant(v);
    for dtype in [DType::F32, DType::BF16] {
        let [q, k, v] = qkv(dtype)?;
        // (mask shape, outer, head, row and column strides, heads); a contiguous mask is
        // one batch axis of 6 pairs.
        let cases: [(&[usize], [i64; 4], i64); 3] = [
            (&[2, 1, 1, 7], [7, 0, 0, 1], 3),
            (&[5, 7], [0, 0, 7, 1], 1),
            (&[2, 3, 5, 7], [35, 0, 7, 1], 1),
        ];
        for (shape, strides, heads) in cases {
            let mask = Tensor::randn(shape, dtype)?;
            mask.realize()?;
            let y = scaled_dot_product_attention(&q, &k, &v, Some(&mask), 0.0, false, None, false)?;
            let found = attentions_writing(&y);
            assert_eq!(found.len(), 1, "{dtype} {shape:?}: {found:?}");
            let m = found[0].mask.as_ref().expect("a mask");
            assert_eq!(m.dtype, dtype);
            assert_eq!(
                (m.strides, m.heads),
                (strides.map(d), d(heads)),
                "{shape:?}"
            );
        }
    }
    Ok(())
}

#[test]
fn boolean_masks_are_read_in_place() -> Result<()> {
    let d = |v: i64| Dim::constant(v);
    let [q, k, v] = qkv(DType::F32)?;
    // SDPA's convention (true takes part): the hidden keys are its `logical_not`, a small
    // value of the mask's own shape, read with broadcast strides.
    let keep = Tensor::randn([5, 7], DType::F32)?.gt(0.0)?;
    let masked = scaled_dot_product_attention(&q, &k, &v, Some(&keep), 0.0, false, None, false)?;
    let found = attentions_writing(&masked);
    assert_eq!(found.len(), 1, "{found:?}");
    let m = found[0].mask.as_ref().expect("a mask");
    assert_eq!(
        (m.dtype, m.strides, m.heads),
        (DType::Bool, [0, 0, 7, 1].map(d), d(1))
    );
    assert!(!found[0].causal);
    // `masked_fill(hidden, -inf)` by hand, with a lower-triangular hide (`j < i`, not the
    // causal mask): a bool mask of the scores' whole shape.
    let scores = q.matmul(&k.transpose(-2, -1)?)?;
    let hidden = scores.ones_like().cast(DType::Bool).tril(-1)?;
    let reversed = scores
        .masked_fill(&hidden, f64::NEG_INFINITY)?
        .softmax(-1)?
        .matmul(&v)?;
    let found = attentions_writing(&reversed);
    assert_eq!(found.len(), 1, "{found:?}");
    let m = found[0].mask.as_ref().expect("a mask");
    assert_eq!(
        (m.dtype, m.strides[2], m.strides[3]),
        (DType::Bool, d(7), d(1))
    );
    assert!(!found[0].causal);
    Ok(())
}

#[test]
fn other_normalizations_are_left_to_the_composition() -> Result<()> {
    let [q, k, v] = qkv(DType::F32)?;
    let scores = q.matmul(&k.transpose(-2, -1)?)?;
    // Softmax along another axis is no attention.
    let columns = scores.softmax(-2)?.matmul(&v.narrow(-2, 0, 7)?)?;
    assert_eq!(attentions_writing(&columns), []);
    // Nor is a fill other than -inf.
    let hidden = scores.ones_like().cast(DType::Bool).tril(-1)?;
    let filled = scores.masked_fill(&hidden, -1e4)?.softmax(-1)?.matmul(&v)?;
    assert_eq!(attentions_writing(&filled), []);
    Ok(())
}

#[test]
fn dropout_of_the_probabilities_is_part_of_the_attention() -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let [q, k, v] = qkv(dtype)?;
        let y = scaled_dot_product_attention(&q, &k, &v, None, 0.25, true, None, false)?;
        let (graph, targets) = inspect::graph_of(&[&y]);
        let order = graph.toposort(&targets);
        let matmuls = find_matmuls(&graph, &order);
        let found: Vec<_> = find_attention(&graph, &order, &matmuls)
            .into_iter()
            .filter(|m| m.writes.contains(&targets[0]))
            .collect();
        assert_eq!(found.len(), 1, "{dtype}: {found:?}");
        let VendorOp::Attention(a) = &found[0].op else {
            panic!("{:?}", found[0].op)
        };
        let d = a.dropout.expect("the dropout");
        assert_eq!(d.threshold, (0.25f64 * 4_294_967_296.0).round() as u32);
        assert!(
            (d.scale.to_f64() - 4.0 / 3.0).abs() < 1e-2,
            "{}",
            d.scale.to_f64()
        );
        assert!(a.causal);
        // q, k, v and the draw's 16-byte key.
        assert_eq!(found[0].operands.len(), 4);
        let key = graph.node(found[0].operands[3]);
        assert_eq!((key.dtype, key.shape.dims().len()), (DType::U32, 1));
    }
    Ok(())
}

/// The backward pieces found in the graph of `outputs`, with the attention each belongs to.
fn backward_pieces(outputs: &[&Tensor]) -> Vec<(AttentionPart, Attention)> {
    let (graph, targets) = inspect::graph_of(outputs);
    let order = graph.toposort(&targets);
    let matmuls = find_matmuls(&graph, &order);
    find_attention(&graph, &order, &matmuls)
        .into_iter()
        .filter_map(|m| match m.op {
            VendorOp::AttentionBackward(b) => Some((b.part, b.forward)),
            _ => None,
        })
        .collect()
}

#[test]
fn sdpa_gradients_are_the_fused_backward_pieces() -> Result<()> {
    let keep = Tensor::randn([5, 7], DType::F32)?.gt(-0.5)?;
    let additive = Tensor::randn([2, 1, 1, 7], DType::F32)?;
    Tensor::realize_all(&[&keep, &additive])?;
    // (dtype, causal, mask, dropout, grouped heads)
    let cases: [(DType, bool, Option<&Tensor>, f64, bool); 6] = [
        (DType::F32, true, None, 0.0, false),
        (DType::BF16, false, None, 0.0, false),
        (DType::F32, false, Some(&keep), 0.0, false),
        (DType::BF16, false, Some(&additive), 0.0, false),
        (DType::F32, true, None, 0.2, false),
        (DType::BF16, true, None, 0.0, true),
    ];
    for (dtype, causal, mask, dropout, gqa) in cases {
        let [q, k, v] = qkv(dtype)?;
        let (k, v) = if gqa {
            (k.narrow(1, 0, 1)?, v.narrow(1, 0, 1)?)
        } else {
            (k, v)
        };
        Tensor::realize_all(&[&k, &v])?;
        let mask = mask.map(|m| {
            if m.dtype() == DType::Bool {
                m.clone()
            } else {
                m.cast(dtype)
            }
        });
        let y =
            scaled_dot_product_attention(&q, &k, &v, mask.as_ref(), dropout, causal, None, gqa)?;
        let r = Tensor::randn(y.dims(), dtype)?;
        let loss = (&y * &r)?.cast(DType::F32).sum_all()?;
        let grads = tessel_tensor::grad(&loss, &[&q, &k, &v])?;
        let found = backward_pieces(&grads.iter().collect::<Vec<_>>());
        let what = format!("{dtype} causal {causal} mask {mask:?} dropout {dropout} gqa {gqa}");
        for part in AttentionPart::ALL {
            let pieces: Vec<_> = found.iter().filter(|(p, _)| *p == part).collect();
            assert_eq!(pieces.len(), 1, "{what}: {part:?} in {found:?}");
            let a = &pieces[0].1;
            assert_eq!(
                (a.dtype, a.causal, a.mask.is_some(), a.dropout.is_some()),
                (dtype, causal, mask.is_some(), dropout > 0.0),
                "{what}: {a}"
            );
            assert_eq!(
                a.kv_group,
                Dim::constant(if gqa { 3 } else { 1 }),
                "{what}: {a}"
            );
        }
    }
    Ok(())
}

#[test]
fn keys_and_values_shared_by_every_pair_keep_the_query_rows() -> Result<()> {
    let q = Tensor::randn([2, 3, 5, 4], DType::F32)?;
    let k = Tensor::randn([7, 4], DType::F32)?;
    let v = Tensor::randn([7, 6], DType::F32)?;
    Tensor::realize_all(&[&q, &k, &v])?;
    let y = scaled_dot_product_attention(&q, &k, &v, None, 0.0, true, None, false)?;
    for a in attentions_writing(&y) {
        // A causal mask counts query rows within a pair: rows folded across pairs are no
        // attention's.
        assert_eq!((a.batch, a.l), (Dim::constant(6), Dim::constant(5)), "{a}");
    }
    Ok(())
}

/// The key gradient's pieces in every form the planner kernelizes: autograd records
/// `dkᵀ = qᵀ·ds` then a permute (the simplified form); the transposed form computes the
/// permuted product as `dk = dsᵀ·q`, matched as the key gradient written as rows.
#[test]
fn the_key_gradient_is_matched_in_both_layouts_the_forms_write() -> Result<()> {
    for dtype in [DType::F32, DType::BF16] {
        let [q, k, v] = qkv(dtype)?;
        let y = scaled_dot_product_attention(&q, &k, &v, None, 0.0, true, None, false)?;
        let r = Tensor::randn(y.dims(), dtype)?;
        let loss = (&y * &r)?.cast(DType::F32).sum_all()?;
        let grads = tessel_tensor::grad(&loss, &[&q, &k, &v])?;
        let (graph, targets) = inspect::graph_of(&grads.iter().collect::<Vec<_>>());
        let forms = forms(&graph, &targets, Budget::default());
        let mut layouts: Vec<(&str, AttentionPart, bool)> = Vec::new();
        for form in &forms.forms {
            let order = form.graph.toposort(&form.targets);
            let matmuls = find_matmuls(&form.graph, &order);
            for m in find_attention(&form.graph, &order, &matmuls) {
                if let VendorOp::AttentionBackward(b) = m.op
                    && matches!(b.part, AttentionPart::Key | AttentionPart::Gradients)
                {
                    layouts.push((form.name, b.part, b.key_rows));
                }
            }
        }
        let mut want = vec![
            ("simplified", AttentionPart::Key, false),
            ("simplified", AttentionPart::Gradients, false),
        ];
        // bf16's graph gives the simplified form alone.
        if dtype == DType::F32 {
            want.extend([
                ("transposed", AttentionPart::Key, true),
                ("transposed", AttentionPart::Gradients, true),
            ]);
        }
        layouts.sort_by_key(|l| (l.0, l.1 as u8, l.2));
        want.sort_by_key(|l| (l.0, l.1 as u8, l.2));
        assert_eq!(layouts, want, "{dtype}");
    }
    Ok(())
}
