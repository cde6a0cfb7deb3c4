//! Text generation with GPT-2 or a Llama-style model from a Hugging Face model directory:
//!
//! ```sh
//! huggingface-cli download gpt2 --local-dir gpt2
//! cargo run --release --example generate --features tokenizers -- gpt2 --prompt "The quick brown fox" --max-new-tokens 50
//! # Without the `tokenizers` feature (or a model without tokenizer.json), give token ids:
//! cargo run --release --example generate -- crates/tessel-models/tests/fixtures/gpt2 --ids 1,2,3
//! ```
//!
//! Options: `--max-new-tokens N` (50), `--temperature T` (0: greedy), `--top-k K`,
//! `--top-p P`, `--seed S`, `--dtype f32|bf16|f16` (f32). `TESSEL_DEVICE` picks the device.
//! The text is printed as it comes; tokens/s at the end.

use std::io::Write as _;
use std::time::Instant;

use tessel::models::{GenerateOptions, causal_lm_from_dir, eos_token_id, generate};
use tessel::{DType, Device};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(dir) = args.first().filter(|a| !a.starts_with("--")) else {
        return Err("usage: generate MODEL_DIR (--prompt TEXT | --ids 1,2,3) [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--dtype f32|bf16|f16]".into());
    };
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let dtype = match flag("--dtype").unwrap_or("f32") {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        other => return Err(format!("--dtype {other}: use f32, bf16 or f16").into()),
    };
    let mut opts = GenerateOptions::greedy(flag("--max-new-tokens").map_or(Ok(50), str::parse)?);
    opts.temperature = flag("--temperature").map_or(Ok(0.0), str::parse)?;
    opts.top_k = flag("--top-k").map(str::parse).transpose()?;
    opts.top_p = flag("--top-p").map(str::parse).transpose()?;
    opts.seed = flag("--seed").map_or(Ok(0), str::parse)?;
    opts.eos_token_id = eos_token_id(dir)?;

    let tokenizer = Tokenizer::open(dir)?;
    let prompt: Vec<i64> = match (flag("--ids"), flag("--prompt")) {
        (Some(ids), _) => ids
            .split(',')
            .map(|t| t.trim().parse())
            .collect::<Result<_, _>>()?,
        (None, Some(text)) => tokenizer.encode(text)?,
        (None, None) => return Err("give --prompt TEXT or --ids 1,2,3".into()),
    };

    let started = Instant::now();
    let model = causal_lm_from_dir(dir, dtype, &Device::default())?;
    eprintln!("loaded {dir} in {:.2} s", started.elapsed().as_secs_f64());

    print!("{}", tokenizer.decode(&prompt)?);
    let mut new = Vec::new();
    let mut shown = 0;
    let mut first_token = None;
    let started = Instant::now();
    generate(&*model, &[prompt], &opts, |_, token| {
        first_token.get_or_insert_with(|| started.elapsed());
        new.push(token);
        // Decode everything so far: a token may complete a character the last one began.
        if let Ok(text) = tokenizer.decode(&new)
            && text.len() > shown
            && text.is_char_boundary(shown)
        {
            print!("{}", &text[shown..]);
            let _ = std::io::stdout().flush();
            shown = text.len();
        }
    })?;
    println!();
    let total = started.elapsed().as_secs_f64();
    let first = first_token.map_or(0.0, |d| d.as_secs_f64());
    let rest = (new.len().saturating_sub(1)) as f64;
    eprintln!(
        "{} tokens in {total:.2} s: first token after {first:.2} s (prompt, plan and compile), then {:.1} tokens/s",
        new.len(),
        if total > first {
            rest / (total - first)
        } else {
            0.0
        }
    );
    Ok(())
}

/// `tokenizer.json` when the `tokenizers` feature is on and the file exists; otherwise
/// token ids are printed as numbers.
struct Tokenizer {
    #[cfg(feature = "tokenizers")]
    inner: Option<tessel::models::tokenizers::Tokenizer>,
}

// Without the `tokenizers` feature the methods use neither `self` nor their `Result`.
#[allow(clippy::unused_self, clippy::unnecessary_wraps)]
impl Tokenizer {
    fn open(dir: &str) -> Result<Tokenizer, Box<dyn std::error::Error>> {
        #[cfg(feature = "tokenizers")]
        {
            let path = std::path::Path::new(dir).join("tokenizer.json");
            let inner = if path.exists() {
                Some(
                    tessel::models::tokenizers::Tokenizer::from_file(&path)
                        .map_err(|e| format!("{}: {e}", path.display()))?,
                )
            } else {
                None
            };
            Ok(Tokenizer { inner })
        }
        #[cfg(not(feature = "tokenizers"))]
        {
            let _ = dir;
            Ok(Tokenizer {})
        }
    }

    fn encode(&self, text: &str) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
        #[cfg(feature = "tokenizers")]
        if let Some(t) = &self.inner {
            let enc = t.encode(text, false).map_err(|e| e.to_string())?;
            return Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect());
        }
        let _ = text;
        Err("--prompt needs the `tokenizers` feature and the model's tokenizer.json; give --ids instead".into())
    }

    fn decode(&self, ids: &[i64]) -> Result<String, Box<dyn std::error::Error>> {
        #[cfg(feature = "tokenizers")]
        if let Some(t) = &self.inner {
            let ids: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
            return Ok(t.decode(&ids, true).map_err(|e| e.to_string())?);
        }
        Ok(ids.iter().map(|i| i.to_string() + " ").collect())
    }
}
