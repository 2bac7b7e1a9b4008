//! Sentence-embedding speed measured as `benchmarks/torch_embed.py`
//! measures sentence-transformers: one warm-up pass over the sentences,
//! then the median rate of ROUNDS passes in batches of 32, then the median
//! latency of each of the first 32 sentences embedded alone.
//!
//! ```sh
//! cargo run --release -p silica-cli --example embed_bench -- [SENTENCES.txt] [DEVICE] [ROUNDS] [MODEL]
//! ```
//!
//! SENTENCES.txt defaults to `benchmarks/sentences.txt`, DEVICE to the best
//! one (`cpu`, `gpu`, ...), ROUNDS to 5, MODEL (a sentence-transformers
//! folder) to the built-in all-MiniLM-L6-v2.

use std::time::Instant;

use silica::{DType, Device};
use silica_models::bert::SentenceEncoder;
use silica_models::resolve::resolve_encoder;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // the tool's allocator, so that the times are those of `silica` itself
    silica_alloc::keep_freed_pages();
    let args: Vec<String> = std::env::args().collect();
    let file = args
        .get(1)
        .map_or("benchmarks/sentences.txt", String::as_str);
    let device = match args.get(2) {
        Some(sel) => Device::select(sel)?,
        None => Device::best()?,
    };
    let rounds: usize = args.get(3).map_or(Ok(5), |s| s.parse())?;
    let text = std::fs::read_to_string(file)?;
    let sentences: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if sentences.is_empty() || rounds == 0 {
        return Err("no sentences, or no rounds".into());
    }
    let model = resolve_encoder(args.get(4).map(String::as_str))?;
    let encoder = SentenceEncoder::load(model, &device, DType::F32)?.with_batch_size(32);
    encoder.embed(&sentences)?;
    let mut rates = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        encoder.embed(&sentences)?;
        rates.push(sentences.len() as f64 / t.elapsed().as_secs_f64());
    }
    let mut latencies = Vec::new();
    for s in sentences.iter().take(32) {
        let t = Instant::now();
        encoder.embed(&[s])?;
        latencies.push(t.elapsed().as_secs_f64());
    }
    println!(
        "silica {device}: {:.1} sentences/s in batches of 32 ({} sentences, median of {rounds}), \
         batch-1 latency p50 {:.2} ms",
        median(rates),
        sentences.len(),
        median(latencies) * 1e3
    );
    Ok(())
}
