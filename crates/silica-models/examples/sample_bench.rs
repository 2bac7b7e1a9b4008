//! The host sampler's time a token over a 128,256-entry vocabulary (Llama
//! 3's) with a few dominant logits, temperature 0.8, for each kind of cut.
//!
//! ```sh
//! cargo run --release -p silica-models --example sample_bench
//! ```

use silica_models::sampling::{Sampler, SamplingParams};

fn main() {
    let v = 128_256usize;
    let mut logits: Vec<f32> = (0..v)
        .map(|i| (i as f32 * 0.7311).sin() * 4.0 + (i * 7919 % 1000) as f32 * 0.002)
        .collect();
    for j in 0..20 {
        logits[(j * 6007) % v] = 14.0 + j as f32 * 0.3;
    }
    let cases = [
        ("top-p 0.9", 0, 0.9, 0.0),
        ("min-p 0.05", 0, 1.0, 0.05),
        ("temperature alone", 0, 1.0, 0.0),
        ("top-k 40", 40, 1.0, 0.0),
    ];
    for (name, top_k, top_p, min_p) in cases {
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.8,
            top_k,
            top_p,
            min_p,
            seed: 1,
            ..SamplingParams::greedy()
        });
        let n = 200;
        let t = std::time::Instant::now();
        let mut sum = 0u64;
        for _ in 0..n {
            sum += u64::from(s.sample(&logits, &[]));
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(n);
        println!("{name}: {ms:.3} ms a token (sum of ids {sum})");
    }
}
