//! The prefill of one prompt, timed four times in one process, then a
//! per-kernel GPU profile of the last run. The first run also builds the
//! GPU pipelines the prefill needs, so it is the slowest.
//!
//! ```sh
//! cargo run --release -p silica-cli --example prefill_profile -- MODEL.gguf PROMPT.txt [f32|f16|bf16] [TOKENS]
//! ```
//!
//! TOKENS: the prompt's tokens repeated or cut to exactly that many (as
//! llama-bench's `-p N`).

use silica::{DType, Device};
use silica_models::gguf::GgufFile;
use silica_models::llama::{Llama, LoadOptions};
use silica_models::sampling::{Sampler, SamplingParams};
use silica_models::tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: prefill_profile MODEL.gguf PROMPT.txt [f32|f16|bf16] [TOKENS]".into());
    }
    let dtype = match args.get(3).map(String::as_str) {
        None | Some("f16") => DType::F16,
        Some("f32") => DType::F32,
        Some("bf16") => DType::BF16,
        Some(other) => return Err(format!("unknown dtype {other}").into()),
    };
    let device = Device::best()?;
    let gguf = GgufFile::open(std::path::Path::new(&args[1]))?;
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let mut ids = tokenizer.encode(&std::fs::read_to_string(&args[2])?, true)?;
    if let Some(n) = args.get(4) {
        let n: usize = n.parse()?;
        if ids.is_empty() {
            return Err("the prompt has no tokens".into());
        }
        ids = ids.iter().copied().cycle().take(n).collect();
    }
    let opts = LoadOptions {
        dtype,
        dequantize: false,
    };
    let model = Llama::load_with(&gguf, &device, opts)?;
    for run in 0..4 {
        if run == 3 && device.info().timestamps {
            device.reset_profile();
            device.set_profiling(true);
        }
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let stats = silica_models::generate::generate(
            &model,
            &tokenizer,
            &ids,
            &mut sampler,
            1,
            &[],
            |_| std::ops::ControlFlow::Continue(()),
        )?;
        println!(
            "run {run}: {} prompt tokens, prefill {:.1} ms",
            stats.prompt_tokens,
            stats.prefill_time.as_secs_f64() * 1e3
        );
    }
    let mut report = device.profile_report_by_grid();
    report.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let total: f64 = report.iter().map(|k| k.seconds).sum();
    println!(
        "GPU time of run 3 (timestamps around each kernel): {:.1} ms",
        total * 1e3
    );
    for k in &report {
        println!(
            "{:16} grid {:?}: {} dispatches, {:.1} µs",
            k.name,
            k.grid.unwrap_or_default(),
            k.dispatches,
            k.seconds * 1e6
        );
    }
    Ok(())
}
