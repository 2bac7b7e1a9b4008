//! Greedy decode steps of one model in one process, three ways: the
//! single-sequence `forward` with each token read back before the next
//! step, the server's pooled `forward_pooled` for `S` sequences with the
//! same read-back, and the pooled step queued on the previous step's
//! argmax before it is read (`forward_pooled_picked`, with the read-back
//! started as the step is queued, as `silica serve` does). Then a per-kernel GPU profile of the pooled steps. It tells the
//! server's model-side cost of a step from its HTTP side.
//!
//! ```sh
//! cargo run --release -p silica-cli --example pooled_decode -- MODEL.gguf [SEQUENCES] [f32|f16]
//! ```

use std::time::Instant;

use silica::{DType, Device, Tensor};
use silica_models::gguf::GgufFile;
use silica_models::llama::{KvPool, Llama, LoadOptions, PickedStep, PoolStep};

const STEPS: usize = 128;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // the tool's allocator, so that the times are those of `silica` itself
    silica_alloc::keep_freed_pages();
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        return Err("usage: pooled_decode MODEL.gguf [SEQUENCES] [f32|f16]".into());
    };
    let seqs: usize = args.get(2).map_or(Ok(1), |s| s.parse())?;
    let dtype = match args.get(3).map(String::as_str) {
        None | Some("f16") => DType::F16,
        Some("f32") => DType::F32,
        Some(other) => return Err(format!("unknown dtype {other}").into()),
    };
    let device = Device::best()?;
    let gguf = GgufFile::open(std::path::Path::new(path))?;
    let model = Llama::load_with(
        &gguf,
        &device,
        LoadOptions {
            dtype,
            dequantize: false,
        },
    )?;
    let prompt: Vec<u32> = (0..16).map(|i| 1 + i * 3).collect();
    println!("{device}, {seqs} sequences, {STEPS} steps after a 16-token prompt");

    for round in 0..2 {
        // one sequence, forward + argmax + read-back per token
        let mut cache = model.new_cache();
        let logits = model.forward(&prompt, &mut cache, true)?;
        let mut next: Vec<u32> = logits.argmax(-1, false)?.to_vec()?;
        let t0 = Instant::now();
        for _ in 0..STEPS {
            let logits = model.forward(&next, &mut cache, true)?;
            next = logits.argmax(-1, false)?.to_vec()?;
        }
        let single = STEPS as f64 / t0.elapsed().as_secs_f64();

        // the pool, read back every step
        let (mut pool, slots, first) = prompted(&model, seqs, &prompt)?;
        let mut next: Vec<u32> = first.to_vec()?;
        let t0 = Instant::now();
        for _ in 0..STEPS {
            let ids: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
            let steps: Vec<PoolStep> = slots
                .iter()
                .zip(&ids)
                .map(|(&slot, ids)| PoolStep { slot, ids })
                .collect();
            next = model
                .forward_pooled(&mut pool, &steps)?
                .argmax(-1, false)?
                .to_vec()?;
        }
        let pooled = STEPS as f64 / t0.elapsed().as_secs_f64();

        // the pool, each step queued on the last one's argmax first
        if round == 1 && device.info().timestamps {
            device.reset_profile();
            device.set_profiling(true);
        }
        let (mut pool, slots, mut picks) = prompted(&model, seqs, &prompt)?;
        let picked: Vec<PickedStep> = slots
            .iter()
            .enumerate()
            .map(|(row, &slot)| PickedStep { slot, row })
            .collect();
        let t0 = Instant::now();
        let mut reading = picks.read_later()?;
        for _ in 0..STEPS {
            let next = model
                .forward_pooled_picked(&mut pool, &[], &picked, Some(&picks))?
                .argmax(-1, false)?;
            let next_read = next.read_later()?;
            let _: Vec<u32> = reading.to_vec()?;
            (picks, reading) = (next, next_read);
        }
        let _: Vec<u32> = reading.to_vec()?;
        let ahead = STEPS as f64 / t0.elapsed().as_secs_f64();
        device.set_profiling(false);
        println!(
            "round {round}: forward {single:.1} steps/s; pooled {pooled:.1} steps/s; pooled, queued ahead {ahead:.1} steps/s ({:.1} tokens/s)",
            ahead * seqs as f64
        );
    }
    let mut report = device.profile_report();
    report.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let total: f64 = report.iter().map(|k| k.seconds).sum();
    let n = (STEPS + 1) as f64;
    println!(
        "GPU time of a queued-ahead pooled step: {:.1} µs",
        total / n * 1e6
    );
    for k in report.iter().take(12) {
        println!(
            "  {:<28} {:>6.1} dispatches {:>9.1} µs",
            k.name,
            k.dispatches as f64 / n,
            k.seconds / n * 1e6
        );
    }
    Ok(())
}

/// A pool of `seqs` slots, each fed `prompt`, and the argmax of that step.
fn prompted(
    model: &Llama,
    seqs: usize,
    prompt: &[u32],
) -> Result<(KvPool, Vec<usize>, Tensor), Box<dyn std::error::Error>> {
    let mut pool = model.new_pool(seqs)?;
    let slots: Vec<usize> = (0..seqs).filter_map(|_| pool.acquire()).collect();
    let steps: Vec<PoolStep> = slots
        .iter()
        .map(|&slot| PoolStep { slot, ids: prompt })
        .collect();
    let picks = model.forward_pooled(&mut pool, &steps)?.argmax(-1, false)?;
    Ok((pool, slots, picks))
}
