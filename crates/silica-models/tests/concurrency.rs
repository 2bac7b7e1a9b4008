//! A loaded model shared between threads: `Llama` and `Tokenizer` are
//! `Send + Sync` and a `KvCache` is `Send` (checked at compile time), and
//! two greedy generations from different prompts running at once on one
//! device, with one shared model, give exactly the tokens each gives when
//! run alone; on the CPU and on every GPU adapter.
//!
//! The model is the tiny random Llama of tests/common/tiny_llama.rs;
//! `SILICA_SOAK_MODEL=default` runs SmolLM2-135M-Instruct instead, and
//! `SILICA_STRESS_TOKENS` sets the tokens per generation (default 300).

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use std::sync::{Barrier, Mutex, MutexGuard};
use std::time::Instant;

use silica_models::generate::{GenerationStats, generate};
use silica_models::llama::{KvCache, Llama};
use silica_models::sampling::{Sampler, SamplingParams};
use silica_models::tokenizer::Tokenizer;
use tiny_llama::Model;

/// Compile-time check: a model and its tokenizer can be shared between
/// threads, and a cache can be handed to another thread.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<Llama>();
    send_sync::<Tokenizer>();
    send::<KvCache>();
    send::<Sampler>();
    send_sync::<GenerationStats>();
};

/// A GPU's memory counters are shared by every test of this binary: the
/// tests take this lock so that one's allocations do not show in the
/// other's counters.
static DEVICE_STATE: Mutex<()> = Mutex::new(());

fn lock_device_state() -> MutexGuard<'static, ()> {
    DEVICE_STATE.lock().unwrap_or_else(|e| e.into_inner())
}

const PROMPTS: [&str; 2] = [
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "The quick brown fox jumps over the lazy dog. The quick brown",
];

fn run(llama: &Llama, tokenizer: &Tokenizer, prompt: &str, tokens: usize) -> Vec<u32> {
    let ids = tokenizer.encode(prompt, true).unwrap();
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let continue_ = |_: &str| std::ops::ControlFlow::Continue(());
    let stats = generate(llama, tokenizer, &ids, &mut sampler, tokens, &[], continue_).unwrap();
    assert!(!stats.tokens.is_empty(), "no token generated");
    stats.tokens
}

#[test]
fn two_generations_at_once_match_their_serial_runs() {
    let _serial = lock_device_state();
    let model = Model::from_env("concurrency");
    let tokens: usize = std::env::var("SILICA_STRESS_TOKENS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(300);
    for dev in tiny_llama::devices() {
        let (llama, tokenizer) = model.load(&dev);
        let t0 = Instant::now();
        let serial: Vec<Vec<u32>> = PROMPTS
            .iter()
            .map(|p| run(&llama, &tokenizer, p, tokens))
            .collect();
        let serial_secs = t0.elapsed().as_secs_f64();
        if model.is_tiny() {
            for s in &serial {
                assert_eq!(s.len(), tokens, "{dev}: the tiny model stopped early");
            }
        }
        assert_ne!(
            serial[0], serial[1],
            "{dev}: both prompts gave the same tokens"
        );
        dev.synchronize().unwrap();
        let before = dev.memory_stats();
        let start = Barrier::new(PROMPTS.len());
        let t1 = Instant::now();
        let concurrent: Vec<Vec<u32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = PROMPTS
                .iter()
                .map(|p| {
                    let (llama, tokenizer, start) = (&llama, &tokenizer, &start);
                    scope.spawn(move || {
                        start.wait();
                        run(llama, tokenizer, p, tokens)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a generation thread panicked"))
                .collect()
        });
        let concurrent_secs = t1.elapsed().as_secs_f64();
        for (i, (a, b)) in serial.iter().zip(&concurrent).enumerate() {
            assert!(
                a == b,
                "{dev}: generation {i} differs when run beside the other \
                 (first difference at token {:?})",
                a.iter().zip(b).position(|(x, y)| x != y)
            );
        }
        dev.synchronize().unwrap();
        let after = dev.memory_stats();
        assert_eq!(after.allocated, before.allocated, "{dev}: {after:?}");
        assert_eq!(after.live_buffers, before.live_buffers, "{dev}: {after:?}");
        eprintln!(
            "{dev} {}: 2 generations of {} and {} tokens identical to the serial runs \
             (serial {serial_secs:.2} s, concurrent {concurrent_secs:.2} s)",
            model.name(),
            serial[0].len(),
            serial[1].len()
        );
    }
}

/// A model on the CPU and the same model on a GPU, each generating on its
/// own thread at once, give their serial tokens too (two devices busy in
/// one process).
#[test]
fn generations_on_two_devices_at_once_match_their_serial_runs() {
    let _serial = lock_device_state();
    let model = Model::from_env("two-devices");
    let devices = tiny_llama::devices();
    if devices.len() < 2 {
        return; // CPU only, allowed without SILICA_REQUIRE_GPU
    }
    let tokens = 100;
    let loaded: Vec<(Llama, Tokenizer)> = devices[..2].iter().map(|d| model.load(d)).collect();
    let serial: Vec<Vec<u32>> = loaded
        .iter()
        .map(|(l, t)| run(l, t, PROMPTS[1], tokens))
        .collect();
    let concurrent: Vec<Vec<u32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = loaded
            .iter()
            .map(|(l, t)| scope.spawn(move || run(l, t, PROMPTS[1], tokens)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(serial, concurrent);
}
