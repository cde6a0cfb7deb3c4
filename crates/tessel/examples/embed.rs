//! Sentence embeddings with a BERT model (sentence-transformers' all-MiniLM-L6-v2 and its
//! kin): the cosine similarity of two sentences' mean-pooled, normalized embeddings.
//!
//! ```sh
//! huggingface-cli download sentence-transformers/all-MiniLM-L6-v2 --local-dir minilm
//! cargo run --release --example embed --features tokenizers -- minilm "A man is eating food." "A man is eating a piece of bread."
//! # Without the `tokenizers` feature, sentences are given as token ids:
//! cargo run --release --example embed -- crates/tessel-models/tests/fixtures/bert 1,5,7 1,5,8,9
//! ```

use tessel::models::Bert;
use tessel::{DType, Device, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, a, b] = args.as_slice() else {
        return Err("usage: embed MODEL_DIR SENTENCE_A SENTENCE_B".into());
    };
    let model = Bert::from_dir(dir, DType::F32, &Device::default())?;
    let rows = [tokens(dir, a)?, tokens(dir, b)?];
    let len = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for r in &rows {
        ids.extend(
            r.iter()
                .copied()
                .chain(std::iter::repeat_n(0, len - r.len())),
        );
        mask.extend((0..len).map(|i| i64::from(i < r.len())));
    }
    let ids = Tensor::from_vec(ids, [2, len])?;
    let mask = Tensor::from_vec(mask, [2, len])?;
    let e = model
        .sentence_embedding(&ids, None, &mask)?
        .to_vec::<f32>()?;
    let (ea, eb) = e.split_at(e.len() / 2);
    let cosine: f32 = ea.iter().zip(eb).map(|(x, y)| x * y).sum();
    println!("cosine similarity: {cosine:.4}");
    Ok(())
}

/// The sentence's tokens (`[CLS] ... [SEP]`) through `tokenizer.json`, or ids given as
/// `1,2,3`.
fn tokens(dir: &str, text: &str) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
    if text.split(',').all(|t| t.trim().parse::<i64>().is_ok()) {
        return Ok(text
            .split(',')
            .map(|t| t.trim().parse())
            .collect::<Result<_, _>>()?);
    }
    #[cfg(feature = "tokenizers")]
    {
        let path = std::path::Path::new(dir).join("tokenizer.json");
        let t = tessel::models::tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let enc = t.encode(text, true).map_err(|e| e.to_string())?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }
    #[cfg(not(feature = "tokenizers"))]
    {
        let _ = dir;
        Err("text needs the `tokenizers` feature; give token ids (1,2,3) instead".into())
    }
}
