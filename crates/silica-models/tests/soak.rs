//! Generation soak: the same loaded model generates 1,000 tokens several
//! times (greedy) on the CPU and on every GPU adapter. After each run the
//! device's allocated bytes and live buffers are back to their values
//! before it (the KV cache and every activation freed), every run gives
//! the same tokens, and the process's resident memory stays flat across
//! runs 2..n (the first run builds the kernels and fills the caches).
//!
//! The model is a tiny random Llama written to a temporary directory
//! (tests/common/tiny_llama.rs), so CI runs it in seconds. By hand:
//! `SILICA_SOAK_MODEL=default` runs SmolLM2-135M-Instruct instead,
//! `SILICA_SOAK_RUNS` sets the runs (default 3) and `SILICA_SOAK_TOKENS`
//! the tokens per run (default 1,000).

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use std::time::Instant;

use silica::Device;
use silica_models::generate::generate;
use silica_models::sampling::{Sampler, SamplingParams};
use tiny_llama::Model;

const MIB: f64 = (1 << 20) as f64;

/// Allowed growth of resident memory from the end of run 2 to the end of
/// any later run. A run's KV cache is a few MiB at most (tiny model: 80
/// KiB; SmolLM2: 1,024 positions x 30 layers x 2 x 192 f32 = 45 MiB, which
/// is allocated again by every run, so a cache that was not freed would
/// show up many times over); the rest is the allocators' free lists
/// settling.
const RSS_BOUND: u64 = 16 << 20;

fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn soak_on(model: &Model, dev: &Device, runs: usize, tokens: usize) {
    let t_load = Instant::now();
    let (llama, tokenizer) = model.load(dev);
    let load_secs = t_load.elapsed().as_secs_f64();
    // counting keeps SmolLM2 going; the tiny model never stops early
    let prompt = tokenizer.encode("1, 2, 3, 4, 5, 6, 7, 8,", true).unwrap();
    assert!(prompt.len() + tokens <= llama.config.context_length);
    let mut first: Option<Vec<u32>> = None;
    let mut rss = Vec::new();
    for run in 1..=runs {
        dev.synchronize().unwrap();
        let before = dev.memory_stats();
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let mut text = 0usize;
        let t0 = Instant::now();
        let stats = generate(
            &llama,
            &tokenizer,
            &prompt,
            &mut sampler,
            tokens,
            &[],
            |piece| {
                text += piece.len();
                std::ops::ControlFlow::Continue(())
            },
        )
        .unwrap();
        let secs = t0.elapsed().as_secs_f64();
        assert_eq!(
            (stats.generated_tokens, stats.stop_reason),
            (tokens, "max tokens"),
            "{dev} run {run}: the generation stopped early"
        );
        assert!(text > 0, "{dev} run {run}: no text came out");
        dev.synchronize().unwrap();
        let after = dev.memory_stats();
        let r = rss_bytes().unwrap_or(0);
        rss.push(r);
        eprintln!(
            "{dev} {}: run {run}: {tokens} tokens in {secs:.2} s ({:.1} tokens/s decode); \
             allocated {} -> {} B, live buffers {} -> {}, reserved {:.2} MiB, \
             peak allocated {:.2} MiB; RSS {:.1} MiB",
            model.name(),
            stats.decode_tokens_per_second(),
            before.allocated,
            after.allocated,
            before.live_buffers,
            after.live_buffers,
            after.reserved as f64 / MIB,
            after.peak_allocated as f64 / MIB,
            r as f64 / MIB,
        );
        assert_eq!(
            after.allocated, before.allocated,
            "{dev} run {run}: device bytes not freed: {after:?}"
        );
        assert_eq!(
            after.live_buffers, before.live_buffers,
            "{dev} run {run}: device buffers not freed: {after:?}"
        );
        if dev.is_gpu() {
            assert!(
                after.peak_allocated > before.allocated,
                "{dev}: the run allocated nothing: {after:?}"
            );
        }
        match &first {
            None => first = Some(stats.tokens),
            Some(t) => assert!(*t == stats.tokens, "{dev} run {run}: other tokens"),
        }
    }
    eprintln!("{dev} {}: model loaded in {load_secs:.2} s", model.name());
    if rss_bytes().is_some() && runs >= 3 {
        let base = rss[1];
        for (i, &r) in rss.iter().enumerate().skip(2) {
            assert!(
                r <= base + RSS_BOUND,
                "{dev}: resident memory grew by {:.1} MiB from run 2 to run {}",
                (r - base) as f64 / MIB,
                i + 1
            );
        }
    }
}

#[test]
fn repeated_generations_leave_no_memory_behind() {
    let model = Model::from_env("soak");
    let runs = env_usize("SILICA_SOAK_RUNS", 3);
    let tokens = env_usize("SILICA_SOAK_TOKENS", 1000);
    assert!(runs >= 1 && tokens >= 1);
    // one device after the other: resident memory is a process-wide figure
    for dev in tiny_llama::devices() {
        soak_on(&model, &dev, runs, tokens);
    }
}
