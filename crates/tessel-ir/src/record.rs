//! Library routines as one line of text that reads back: [`VendorOp::record`] and
//! [`VendorOp::from_record`], so a plan stored on disk can name the routines it runs
//! (kernels go through their text form, [`Kernel::parse`](crate::Kernel::parse)).
//!
//! The line is the op's fields in declaration order, separated by spaces. Like the kernel
//! text form it holds constant sizes only: an op with a symbolic size has no record.

use tessel_shape::{DType, Dim, Scalar};

use crate::vendor::{
    Activation, Attention, AttentionBackward, AttentionDropout, AttentionLayout, AttentionMask,
    AttentionPart, Epilogue, Matmul, VendorOp,
};

impl VendorOp {
    /// The op as one line of text, or `None` where a size is symbolic.
    pub fn record(&self) -> Option<String> {
        let mut w = Writer(Vec::new());
        match self {
            VendorOp::Matmul(m) => {
                w.word("matmul");
                w.matmul(m)?;
            }
            VendorOp::Attention(a) => {
                w.word("attention");
                w.attention(a)?;
            }
            VendorOp::AttentionBackward(b) => {
                w.word("attention_backward");
                w.word(match b.part {
                    AttentionPart::LogSumExp => "lse",
                    AttentionPart::Query => "dq",
                    AttentionPart::Key => "dk",
                    AttentionPart::Value => "dv",
                });
                w.attention(&b.forward)?;
            }
        }
        Some(w.0.join(" "))
    }

    /// The op [`VendorOp::record`] wrote as `line`, or `None` if `line` is not one.
    pub fn from_record(line: &str) -> Option<VendorOp> {
        let mut r = Reader(line.split(' '));
        let op = match r.word()? {
            "matmul" => VendorOp::Matmul(r.matmul()?),
            "attention" => VendorOp::Attention(r.attention()?),
            "attention_backward" => {
                let part = match r.word()? {
                    "lse" => AttentionPart::LogSumExp,
                    "dq" => AttentionPart::Query,
                    "dk" => AttentionPart::Key,
                    "dv" => AttentionPart::Value,
                    _ => return None,
                };
                VendorOp::AttentionBackward(AttentionBackward {
                    forward: r.attention()?,
                    part,
                })
            }
            _ => return None,
        };
        r.0.next().is_none().then_some(op)
    }
}

struct Writer(Vec<String>);

impl Writer {
    fn word(&mut self, w: &str) {
        self.0.push(w.to_string());
    }

    fn dim(&mut self, d: Dim) -> Option<()> {
        self.0.push(d.as_const()?.to_string());
        Some(())
    }

    fn dims(&mut self, ds: &[Dim]) -> Option<()> {
        ds.iter().try_for_each(|&d| self.dim(d))
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
        self.0.push(s.to_bits().to_string());
    }

    fn matmul(&mut self, m: &Matmul) -> Option<()> {
        self.dtype(m.dtype);
        self.dims(&[m.batch, m.m, m.n, m.k])?;
        self.flag(m.lhs_transposed);
        self.flag(m.rhs_transposed);
        self.dims(&[m.lhs_batch_stride, m.rhs_batch_stride])?;
        self.flag(m.allow_tf32);
        self.flag(m.epilogue.bias);
        self.word(match m.epilogue.activation {
            Activation::Identity => "identity",
            Activation::Relu => "relu",
            Activation::GeluTanh => "gelu_tanh",
        });
        Some(())
    }

    fn attention(&mut self, a: &Attention) -> Option<()> {
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
        ])?;
        self.scalar(a.scale);
        self.flag(a.causal);
        match &a.mask {
            Some(m) => {
                self.word("mask");
                self.dtype(m.dtype);
                self.dim(m.heads)?;
                self.dims(&m.strides)?;
            }
            None => self.word("-"),
        }
        match &a.dropout {
            Some(d) => {
                self.word("dropout");
                self.0.push(d.threshold.to_string());
                self.scalar(d.scale);
            }
            None => self.word("-"),
        }
        match &a.layout {
            Some(l) => {
                self.word("layout");
                self.dim(l.heads)?;
                for rows in [&l.q, &l.k, &l.v, &l.out] {
                    self.dims(rows)?;
                }
            }
            None => self.word("-"),
        }
        Some(())
    }
}

struct Reader<'a>(std::str::Split<'a, char>);

impl Reader<'_> {
    fn word(&mut self) -> Option<&str> {
        self.0.next()
    }

    fn dim(&mut self) -> Option<Dim> {
        self.word()?.parse().ok().map(Dim::constant)
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
        let ops = [
            VendorOp::Matmul(matmul),
            VendorOp::Attention(attention()),
            VendorOp::Attention(masked.clone()),
            VendorOp::AttentionBackward(AttentionBackward {
                forward: masked,
                part: AttentionPart::Key,
            }),
        ];
        for op in ops {
            let line = op.record().unwrap();
            assert_eq!(VendorOp::from_record(&line), Some(op), "{line}");
            assert!(VendorOp::from_record(&format!("{line} 1")).is_none());
            assert!(VendorOp::from_record(line.rsplit_once(' ').unwrap().0).is_none());
        }
    }

    #[test]
    fn symbolic_sizes_have_no_record() {
        let mut a = attention();
        a.l = Var::new("l", 1, 4096).unwrap().into();
        assert_eq!(VendorOp::Attention(a).record(), None);
    }
}
