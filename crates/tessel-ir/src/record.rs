//! Library routines as one line of text that reads back: [`VendorOp::record`] and
//! [`VendorOp::from_record`], so a plan stored on disk can name the routines it runs
//! (kernels go through their text form, [`Kernel::parse`](crate::Kernel::parse)).
//!
//! The line is the op's fields in declaration order, separated by `|`; a symbolic size is
//! its expression's text, its variables given back by name when the line is read.

use tessel_shape::{DType, Dim, Scalar, Var};

use crate::vendor::{
    Activation, Attention, AttentionBackward, AttentionDropout, AttentionLayout, AttentionMask,
    AttentionPart, Epilogue, Matmul, VendorOp,
};

impl VendorOp {
    /// The op as one line of text.
    pub fn record(&self) -> String {
        self.write().fields.join("|")
    }

    /// The variables the op's sizes name (each once), which [`VendorOp::from_record`]
    /// needs back.
    pub fn vars(&self) -> Vec<Var> {
        self.write().vars
    }

    fn write(&self) -> Writer {
        let mut w = Writer::default();
        match self {
            VendorOp::Matmul(m) => {
                w.word("matmul");
                w.matmul(m);
            }
            VendorOp::Attention(a) => {
                w.word("attention");
                w.attention(a);
            }
            VendorOp::AttentionBackward(b) => {
                w.word("attention_backward");
                w.word(match (b.part, b.key_rows) {
                    (AttentionPart::LogSumExp, _) => "lse",
                    (AttentionPart::Query, _) => "dq",
                    (AttentionPart::Key, false) => "dk",
                    (AttentionPart::Key, true) => "dk_rows",
                    (AttentionPart::Value, _) => "dv",
                    (AttentionPart::Gradients, false) => "dqkv",
                    (AttentionPart::Gradients, true) => "dqkv_rows",
                    (AttentionPart::OutputAndLogSumExp, _) => "out_lse",
                });
                w.attention(&b.forward);
            }
        }
        w
    }

    /// The op [`VendorOp::record`] wrote as `line`, its sizes' variables among `vars` (by
    /// name), or `None` if `line` is not one.
    pub fn from_record(line: &str, vars: &[Var]) -> Option<VendorOp> {
        let mut r = Reader {
            fields: line.split('|'),
            vars,
        };
        let op = match r.word()? {
            "matmul" => VendorOp::Matmul(r.matmul()?),
            "attention" => VendorOp::Attention(r.attention()?),
            "attention_backward" => {
                let (part, key_rows) = match r.word()? {
                    "lse" => (AttentionPart::LogSumExp, false),
                    "dq" => (AttentionPart::Query, false),
                    "dk" => (AttentionPart::Key, false),
                    "dk_rows" => (AttentionPart::Key, true),
                    "dv" => (AttentionPart::Value, false),
                    "dqkv" => (AttentionPart::Gradients, false),
                    "dqkv_rows" => (AttentionPart::Gradients, true),
                    "out_lse" => (AttentionPart::OutputAndLogSumExp, false),
                    _ => return None,
                };
                VendorOp::AttentionBackward(AttentionBackward {
                    forward: r.attention()?,
                    part,
                    key_rows,
                })
            }
            _ => return None,
        };
        r.fields.next().is_none().then_some(op)
    }
}

#[derive(Default)]
struct Writer {
    fields: Vec<String>,
    vars: Vec<Var>,
}

impl Writer {
    fn word(&mut self, w: &str) {
        self.fields.push(w.to_string());
    }

    fn dim(&mut self, d: Dim) {
        for v in d.vars() {
            if !self.vars.contains(&v) {
                self.vars.push(v);
            }
        }
        self.fields.push(d.to_string());
    }

    fn dims(&mut self, ds: &[Dim]) {
        for &d in ds {
            self.dim(d);
        }
    }

    fn flag(&mut self, b: bool) {
        self.word(if b { "1" } else { "0" });
    }

    fn dtype(&mut self, d: DType) {
        self.word(d.name());
    }

    /// A scalar as its dtype and bits, exact for every value (NaN payloads too).
    fn scalar(&mut self, s: Scalar) {
        self.dtype(s.dtype());
        self.fields.push(s.to_bits().to_string());
    }

    fn matmul(&mut self, m: &Matmul) {
        self.dtype(m.dtype);
        self.dims(&[m.batch, m.m, m.n, m.k]);
        self.flag(m.lhs_transposed);
        self.flag(m.rhs_transposed);
        self.dims(&[m.lhs_batch_stride, m.rhs_batch_stride]);
        self.flag(m.allow_tf32);
        self.flag(m.epilogue.bias);
        self.word(match m.epilogue.activation {
            Activation::Identity => "identity",
            Activation::Relu => "relu",
            Activation::GeluTanh => "gelu_tanh",
            Activation::Gelu => "gelu",
        });
    }

    fn attention(&mut self, a: &Attention) {
        self.dtype(a.dtype);
        self.dims(&[
            a.batch,
            a.l,
            a.s,
            a.e,
            a.ev,
            a.q_batch_stride,
            a.k_batch_stride,
            a.v_batch_stride,
            a.kv_group,
        ]);
        self.scalar(a.scale);
        self.flag(a.causal);
        match &a.mask {
            Some(m) => {
                self.word("mask");
                self.dtype(m.dtype);
                self.dim(m.heads);
                self.dims(&m.strides);
            }
            None => self.word("-"),
        }
        match &a.dropout {
            Some(d) => {
                self.word("dropout");
                self.fields.push(d.threshold.to_string());
                self.scalar(d.scale);
            }
            None => self.word("-"),
        }
        match &a.layout {
            Some(l) => {
                self.word("layout");
                self.dim(l.heads);
                for rows in [&l.q, &l.k, &l.v, &l.out] {
                    self.dims(rows);
                }
            }
            None => self.word("-"),
        }
    }
}

struct Reader<'a> {
    fields: std::str::Split<'a, char>,
    vars: &'a [Var],
}

impl Reader<'_> {
    fn word(&mut self) -> Option<&str> {
        self.fields.next()
    }

    fn dim(&mut self) -> Option<Dim> {
        let text = self.fields.next()?;
        Dim::parse(text, |name| {
            self.vars.iter().copied().find(|v| &*v.name() == name)
        })
    }

    fn dims<const N: usize>(&mut self) -> Option<[Dim; N]> {
        let mut out = [Dim::constant(0); N];
        for d in &mut out {
            *d = self.dim()?;
        }
        Some(out)
    }

    fn flag(&mut self) -> Option<bool> {
        match self.word()? {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        }
    }

    fn dtype(&mut self) -> Option<DType> {
        self.word()?.parse().ok()
    }

    fn scalar(&mut self) -> Option<Scalar> {
        let dtype = self.dtype()?;
        Some(Scalar::from_bits(dtype, self.word()?.parse().ok()?))
    }

    fn matmul(&mut self) -> Option<Matmul> {
        let dtype = self.dtype()?;
        let [batch, m, n, k] = self.dims()?;
        let lhs_transposed = self.flag()?;
        let rhs_transposed = self.flag()?;
        let [lhs_batch_stride, rhs_batch_stride] = self.dims()?;
        let allow_tf32 = self.flag()?;
        let bias = self.flag()?;
        let activation = match self.word()? {
            "identity" => Activation::Identity,
            "relu" => Activation::Relu,
            "gelu_tanh" => Activation::GeluTanh,
            "gelu" => Activation::Gelu,
            _ => return None,
        };
        Some(Matmul {
            dtype,
            batch,
            m,
            n,
            k,
            lhs_transposed,
            rhs_transposed,
            lhs_batch_stride,
            rhs_batch_stride,
            allow_tf32,
            epilogue: Epilogue { bias, activation },
        })
    }

    fn attention(&mut self) -> Option<Attention> {
        let dtype = self.dtype()?;
        let [
            batch,
            l,
            s,
            e,
            ev,
            q_batch_stride,
            k_batch_stride,
            v_batch_stride,
            kv_group,
        ] = self.dims()?;
        let scale = self.scalar()?;
        let causal = self.flag()?;
        let mask = match self.word()? {
            "mask" => Some(AttentionMask {
                dtype: self.dtype()?,
                heads: self.dim()?,
                strides: self.dims()?,
            }),
            "-" => None,
            _ => return None,
        };
        let dropout = match self.word()? {
            "dropout" => Some(AttentionDropout {
                threshold: self.word()?.parse().ok()?,
                scale: self.scalar()?,
            }),
            "-" => None,
            _ => return None,
        };
        let layout = match self.word()? {
            "layout" => Some(Box::new(AttentionLayout {
                heads: self.dim()?,
                q: self.dims()?,
                k: self.dims()?,
                v: self.dims()?,
                out: self.dims()?,
            })),
            "-" => None,
            _ => return None,
        };
        Some(Attention {
            dtype,
            batch,
            l,
            s,
            e,
            ev,
            q_batch_stride,
            k_batch_stride,
            v_batch_stride,
            kv_group,
            scale,
            causal,
            mask,
            dropout,
            layout,
        })
    }
}

#[cfg(test)]
mod tests {
    use tessel_shape::{DType, Dim, Scalar, Var};

    use crate::vendor::{
        Activation, Attention, AttentionBackward, AttentionDropout, AttentionLayout, AttentionMask,
        AttentionPart, Epilogue, Matmul, VendorOp,
    };

    fn c(v: i64) -> Dim {
        Dim::constant(v)
    }

    fn attention() -> Attention {
        Attention {
            dtype: DType::BF16,
            batch: c(96),
            l: c(512),
            s: c(512),
            e: c(64),
            ev: c(64),
            q_batch_stride: c(32768),
            k_batch_stride: c(32768),
            v_batch_stride: c(32768),
            kv_group: c(1),
            scale: Scalar::F32(0.125),
            causal: true,
            mask: None,
            dropout: None,
            layout: None,
        }
    }

    #[test]
    fn routines_read_back_from_their_records() {
        let matmul = Matmul {
            dtype: DType::F32,
            batch: c(4),
            m: c(128),
            n: c(768),
            k: c(3072),
            lhs_transposed: false,
            rhs_transposed: true,
            lhs_batch_stride: c(0),
            rhs_batch_stride: c(3072 * 768),
            allow_tf32: true,
            epilogue: Epilogue {
                bias: true,
                activation: Activation::GeluTanh,
            },
        };
        let mut masked = attention();
        masked.mask = Some(AttentionMask {
            dtype: DType::F32,
            heads: c(12),
            strides: [c(6144), c(512), c(0), c(1)],
        });
        masked.dropout = Some(AttentionDropout {
            threshold: 429_496_730,
            scale: Scalar::F32(f32::from_bits(0x7fc0_0001)),
        });
        masked.layout = Some(Box::new(AttentionLayout {
            heads: c(12),
            q: [c(0), c(64), c(2304), c(1)],
            k: [c(768), c(64), c(2304), c(1)],
            v: [c(1536), c(64), c(2304), c(1)],
            out: [c(0), c(64), c(768), c(1)],
        }));
        let mut ops = vec![
            VendorOp::Matmul(matmul),
            VendorOp::Attention(attention()),
            VendorOp::Attention(masked.clone()),
        ];
        for part in AttentionPart::ALL {
            for &key_rows in part.key_layouts() {
                ops.push(VendorOp::AttentionBackward(AttentionBackward {
                    forward: masked.clone(),
                    part,
                    key_rows,
                }));
            }
        }
        for op in ops {
            let line = op.record();
            assert!(op.vars().is_empty());
            assert_eq!(VendorOp::from_record(&line, &[]), Some(op), "{line}");
            assert!(VendorOp::from_record(&format!("{line}|1"), &[]).is_none());
            assert!(VendorOp::from_record(line.rsplit_once('|').unwrap().0, &[]).is_none());
        }
    }

    #[test]
    fn symbolic_sizes_read_back_with_their_variables() {
        let s = Var::new("s", 1, 4096).unwrap();
        let mut a = attention();
        a.l = Dim::constant(1);
        a.s = s.into();
        a.k_batch_stride = Dim::from(s) * 64;
        a.v_batch_stride = Dim::from(s) * 64;
        let op = VendorOp::Attention(a);
        assert_eq!(op.vars(), [s]);
        let line = op.record();
        assert_eq!(VendorOp::from_record(&line, &[s]), Some(op), "{line}");
        assert_eq!(VendorOp::from_record(&line, &[]), None, "{line}");
    }
}
