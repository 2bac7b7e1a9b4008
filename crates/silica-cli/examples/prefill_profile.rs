//! The prefill of one prompt, timed RUNS times back to back in one
//! process (4 by default), then a per-kernel GPU profile of the last run.
//! The first run also builds the GPU pipelines the prefill needs, so it is
//! the slowest. With more than 4 runs, the min / median / max of the
//! second half is printed: an NVIDIA GPU driven through Vulkan raises its
//! clock only after some time of steady work (docs/tuning.md, "GPU clocks
//! follow the load"), as llama-bench's repetitions give it.
//!
//! ```sh
//! cargo run --release -p silica-cli --example prefill_profile -- MODEL.gguf PROMPT.txt [f32|f16|bf16] [TOKENS] [RUNS]
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
    // the tool's allocator, so that the times are those of `silica` itself
    silica_alloc::keep_freed_pages();
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
    let runs: usize = args.get(5).map_or(Ok(4), |s| s.parse())?;
    if runs < 2 {
        return Err("RUNS must be at least 2".into());
    }
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        if run + 1 == runs && device.info().timestamps {
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
        let ms = stats.prefill_time.as_secs_f64() * 1e3;
        println!(
            "run {run}: {} prompt tokens, prefill {ms:.1} ms",
            stats.prompt_tokens
        );
        times.push(ms);
    }
    if runs > 4 {
        // the profiled last run left out
        let mut late = times[runs / 2..runs - 1].to_vec();
        late.sort_by(f64::total_cmp);
        println!(
            "runs {}-{}: min {:.1} ms, median {:.1} ms, max {:.1} ms",
            runs / 2,
            runs - 2,
            late[0],
            late[late.len() / 2],
            late[late.len() - 1]
        );
    }
    let mut report = device.profile_report_by_grid();
    report.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let total: f64 = report.iter().map(|k| k.seconds).sum();
    println!(
        "GPU time of run {} (timestamps around each kernel): {:.1} ms",
        runs - 1,
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
