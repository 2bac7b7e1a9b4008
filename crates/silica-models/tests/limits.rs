//! Models at the limits of memory and of their context.
//!
//! * Out of memory: under a device memory limit smaller than a model,
//!   `Llama::load` (the default SmolLM2 GGUF) and `SentenceEncoder::load`
//!   (the default MiniLM folder) fail with `silica::Error::OutOfMemory`, the
//!   partly loaded weights are all freed (the allocator's counters return to
//!   their values before the load), and the same device then loads and runs
//!   a smaller model, and the large one once the limit is lifted; on the
//!   first GPU and on the CPU.
//! * The context: with a tiny random model of 64 positions, generation
//!   stops with `context full` after the last position, its tokens are
//!   those of one uncached forward pass over the whole sequence, and a
//!   `forward` past the context is an error that leaves the cache as it was.
//!
//! The memory limit belongs to the device, which every test of this binary
//! shares (the CPU's is process-wide), so every test takes one lock.

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use silica::{DType, Device, MemoryStats};
use silica_models::Error;
use silica_models::bert::SentenceEncoder;
use silica_models::generate::generate;
use silica_models::gguf::GgufFile;
use silica_models::llama::Llama;
use silica_models::resolve::{resolve_decoder, resolve_encoder};
use silica_models::sampling::{Sampler, SamplingParams, argmax};
use silica_models::tokenizer::Tokenizer;
use tiny_llama::Tiny;

const MIB: u64 = 1 << 20;
/// The context of the tiny model.
const CONTEXT: usize = 64;

static DEVICE_STATE: Mutex<()> = Mutex::new(());

fn lock_device_state() -> MutexGuard<'static, ()> {
    DEVICE_STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The first GPU adapter, or `None` (a failure under `SILICA_REQUIRE_GPU=1`).
fn first_gpu() -> Option<Device> {
    if silica::adapters().is_empty() {
        assert!(
            std::env::var("SILICA_REQUIRE_GPU").as_deref() != Ok("1"),
            "SILICA_REQUIRE_GPU=1 but no GPU adapter"
        );
        eprintln!("no GPU adapter: GPU cases skipped");
        return None;
    }
    Some(Device::gpu(0).expect("the first adapter opens"))
}

/// Removes the memory limit when dropped, even if the test panics.
struct NoLimitOnDrop(Device);

impl Drop for NoLimitOnDrop {
    fn drop(&mut self) {
        self.0.set_memory_limit(None);
    }
}

/// The counters once submitted work is done.
fn stats(dev: &Device) -> MemoryStats {
    dev.synchronize().unwrap();
    dev.memory_stats()
}

/// The tiny model of [`CONTEXT`] positions, written once per process.
fn tiny_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("limits_tiny.gguf");
        Tiny::new(CONTEXT).write(&path);
        path
    })
}

fn tiny_model(dev: &Device) -> Result<(Llama, Tokenizer), Error> {
    let gguf = GgufFile::open(tiny_path())?;
    Ok((
        Llama::load(&gguf, dev, DType::F32)?,
        Tokenizer::from_gguf(&gguf)?,
    ))
}

/// Asserts `r` is an out-of-memory error under `limit`, with a message
/// that says so.
fn assert_out_of_memory<T>(r: Result<T, Error>, limit: u64, what: &str) {
    match r {
        Ok(_) => panic!("{what} loaded under a limit of {limit} bytes"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                matches!(
                    &e,
                    Error::Tensor(silica::Error::OutOfMemory { limit: Some(l), .. }) if *l == limit
                ),
                "{what}: not an out-of-memory error: {msg}"
            );
            assert!(msg.contains("out of memory"), "{what}: {msg}");
            assert!(
                msg.contains(&format!("a limit of {limit} bytes")),
                "{what}: {msg}"
            );
            eprintln!("{what}: {msg}");
        }
    }
}

/// Greedy generation of up to `n` tokens after `prompt`.
fn greedy(model: &Llama, tok: &Tokenizer, prompt: &[u32], n: usize) -> (Vec<u32>, &'static str) {
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let stats = generate(model, tok, prompt, &mut sampler, n, &[], |_| {
        ControlFlow::Continue(())
    })
    .unwrap();
    (stats.tokens, stats.stop_reason)
}

#[test]
fn a_decoder_larger_than_the_memory_limit_fails_to_load_and_frees_what_it_took() {
    // the CPU is the reference below (logits within 1e-3): its exact
    // products, not the 8-bit activations of its Q4_0/Q8_0 products
    silica::set_cpu_int8_activations(false);
    let _serial = lock_device_state();
    let Some(dev) = first_gpu() else {
        return;
    };
    let big_path = resolve_decoder(None).expect("the default decoder");
    let big = GgufFile::open(&big_path).unwrap();
    let big_bytes: u64 = big.tensors().iter().map(|t| t.size).sum();
    dev.empty_cache();
    let base = stats(&dev);
    let _unlimit = NoLimitOnDrop(dev.clone());

    // A limit below the first weight, then one that fails partway, after
    // many weights were uploaded.
    for room in [MIB, big_bytes / 2] {
        let limit = base.reserved + room;
        dev.set_memory_limit(Some(limit));
        assert_out_of_memory(
            Llama::load(&big, &dev, DType::F32),
            limit,
            &format!("SmolLM2 ({big_bytes} bytes) with {room} bytes of room"),
        );
        let after = stats(&dev);
        assert_eq!(after.allocated, base.allocated, "{after:?} vs {base:?}");
        assert_eq!(
            after.live_buffers, base.live_buffers,
            "{after:?} vs {base:?}"
        );
        assert!(after.reserved <= limit, "{after:?}");
        dev.empty_cache();
        assert_eq!(stats(&dev).reserved, base.reserved);
    }

    // Under the same limit, a smaller model loads and generates.
    let tiny_bytes = Tiny::new(CONTEXT).weight_bytes();
    let room = 4 * tiny_bytes;
    assert!(room < big_bytes / 2);
    dev.set_memory_limit(Some(base.reserved + room));
    let (tiny, tok) = tiny_model(&dev).expect("the tiny model fits");
    let prompt = tok.encode("a b c", true).unwrap();
    let (tokens, reason) = greedy(&tiny, &tok, &prompt, 8);
    assert_eq!((tokens.len(), reason), (8, "max tokens"));
    let (cpu_tiny, _) = tiny_model(&Device::cpu()).unwrap();
    assert_eq!(
        tokens,
        greedy(&cpu_tiny, &tok, &prompt, 8).0,
        "the GPU generates what the CPU does"
    );

    // Out of memory inside a forward pass (no room left for activations
    // or a larger KV cache): an error, and the cache keeps its positions.
    let mut cache = tiny.new_cache();
    tiny.forward(&prompt, &mut cache, true).unwrap();
    let more = [5u32; 40];
    for room in [0, 8 << 10, 32 << 10, 64 << 10] {
        dev.empty_cache();
        let limit = stats(&dev).reserved + room;
        dev.set_memory_limit(Some(limit));
        let r = tiny.forward(&more, &mut cache, false);
        assert_out_of_memory(
            r,
            limit,
            &format!("a forward pass with {room} bytes of room"),
        );
        assert_eq!(cache.len(), prompt.len());
    }
    dev.set_memory_limit(None);
    let got: Vec<f32> = tiny
        .forward(&more, &mut cache, false)
        .unwrap()
        .to_vec()
        .unwrap();
    let mut cpu_cache = cpu_tiny.new_cache();
    cpu_tiny.forward(&prompt, &mut cpu_cache, true).unwrap();
    let want: Vec<f32> = cpu_tiny
        .forward(&more, &mut cpu_cache, false)
        .unwrap()
        .to_vec()
        .unwrap();
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst < 1e-3,
        "after the failed pass, GPU vs CPU differ by {worst}"
    );
    drop((tiny, cache));

    // Without the limit the large model loads and runs on the same device.
    dev.set_memory_limit(None);
    let model = Llama::load(&big, &dev, DType::F32).expect("SmolLM2 loads without a limit");
    let mut cache = model.new_cache();
    let logits: Vec<f32> = model
        .forward(&[1, 2, 3], &mut cache, true)
        .unwrap()
        .to_vec()
        .unwrap();
    assert_eq!(logits.len(), model.config.vocab_size);
    assert!(logits.iter().all(|v| v.is_finite()));
    drop((model, cache));
    dev.empty_cache();
    assert_eq!(stats(&dev).allocated, base.allocated);
}

#[test]
fn an_encoder_larger_than_the_memory_limit_fails_to_load_and_frees_what_it_took() {
    let _serial = lock_device_state();
    let Some(dev) = first_gpu() else {
        return;
    };
    let dir = resolve_encoder(None).expect("the default encoder");
    dev.empty_cache();
    let base = stats(&dev);
    let _unlimit = NoLimitOnDrop(dev.clone());
    // Below the word embedding (47 MB), then past it.
    for room in [16 * MIB, 64 * MIB] {
        let limit = base.reserved + room;
        dev.set_memory_limit(Some(limit));
        assert_out_of_memory(
            SentenceEncoder::load(&dir, &dev, DType::F32),
            limit,
            &format!("MiniLM (91 MB) with {room} bytes of room"),
        );
        let after = stats(&dev);
        assert_eq!(after.allocated, base.allocated, "{after:?} vs {base:?}");
        assert_eq!(
            after.live_buffers, base.live_buffers,
            "{after:?} vs {base:?}"
        );
        dev.empty_cache();
        assert_eq!(stats(&dev).reserved, base.reserved);
    }

    dev.set_memory_limit(None);
    let enc = SentenceEncoder::load(&dir, &dev, DType::F32).expect("loads without a limit");
    let v = enc.embed(&["out of memory, then fine"]).unwrap();
    assert_eq!(v.len(), 1);
    assert!(v[0].iter().all(|x| x.is_finite()));
}

#[test]
fn on_the_cpu_too_a_decoder_larger_than_the_memory_limit_fails_to_load() {
    let _serial = lock_device_state();
    let cpu = Device::cpu();
    let big_path = resolve_decoder(None).expect("the default decoder");
    let big = GgufFile::open(&big_path).unwrap();
    let big_bytes: u64 = big.tensors().iter().map(|t| t.size).sum();
    let base = cpu.memory_stats();
    let _unlimit = NoLimitOnDrop(cpu.clone());
    for room in [MIB, big_bytes / 2] {
        let limit = base.allocated + room;
        cpu.set_memory_limit(Some(limit));
        assert_out_of_memory(
            Llama::load(&big, &cpu, DType::F32),
            limit,
            &format!("SmolLM2 on the CPU with {room} bytes of room"),
        );
        let after = cpu.memory_stats();
        assert_eq!(after.allocated, base.allocated, "{after:?} vs {base:?}");
        assert_eq!(after.live_buffers, base.live_buffers);
    }
    // under the same limit a smaller model loads and generates what it
    // generates without one
    cpu.set_memory_limit(Some(base.allocated + 4 * Tiny::new(CONTEXT).weight_bytes()));
    let (tiny, tok) = tiny_model(&cpu).expect("the tiny model fits");
    let prompt = tok.encode("a b c", true).unwrap();
    let tokens = greedy(&tiny, &tok, &prompt, 8).0;
    cpu.set_memory_limit(None);
    assert_eq!(tokens, greedy(&tiny, &tok, &prompt, 8).0);
    drop(tiny);
    let model = Llama::load(&big, &cpu, DType::F32).expect("SmolLM2 loads without a limit");
    drop(model);
    assert_eq!(cpu.memory_stats().allocated, base.allocated);
}

/// Generation until the context is full, checked against one uncached
/// pass over the whole sequence; `forward` past the context.
fn check_context(dev: &Device) {
    let (model, tok) = tiny_model(dev).unwrap();
    assert_eq!(model.config.context_length, CONTEXT);
    let vocab = model.config.vocab_size;
    let prompt = tok.encode("a b c d e f g h i", true).unwrap();
    let p = prompt.len();
    assert!(p > 2 && p < CONTEXT / 2, "{p} prompt tokens");

    // max_tokens beyond the context: stops after the last position
    let (tokens, reason) = greedy(&model, &tok, &prompt, 1000);
    assert_eq!(reason, "context full");
    // every position holds a token; the last one generated is never fed back
    assert_eq!(p + tokens.len(), CONTEXT + 1);
    assert!(tokens.iter().all(|&t| (t as usize) < vocab && t != 2));
    let mut all = prompt.clone();
    all.extend(&tokens[..tokens.len() - 1]);
    assert_eq!(all.len(), CONTEXT);
    let mut cache = model.new_cache();
    let logits: Vec<f32> = model
        .forward(&all, &mut cache, false)
        .unwrap()
        .to_vec()
        .unwrap();
    let uncached: Vec<u32> = (p - 1..CONTEXT)
        .map(|pos| argmax(&logits[pos * vocab..(pos + 1) * vocab]))
        .collect();
    assert_eq!(tokens, uncached, "generated tokens vs one uncached pass");

    // a full cache takes no more positions, and stays full
    let err = model.forward(&[5], &mut cache, true).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    assert!(
        err.to_string()
            .contains("65 positions exceed the model's context of 64 tokens"),
        "{err}"
    );
    assert_eq!(cache.len(), CONTEXT);

    // a step that would cross the end fails without changing the cache;
    // the steps that fit then give the uncached logits
    let mut cache = model.new_cache();
    model.forward(&all[..60], &mut cache, true).unwrap();
    let five = [all[60], all[61], all[62], all[63], 7];
    let err = model.forward(&five, &mut cache, false).unwrap_err();
    assert!(
        err.to_string().contains("exceed the model's context"),
        "{err}"
    );
    assert_eq!(cache.len(), 60);
    let last: Vec<f32> = model
        .forward(&all[60..], &mut cache, false)
        .unwrap()
        .to_vec()
        .unwrap();
    let want = &logits[60 * vocab..];
    let worst = last
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-3, "cached vs uncached logits differ by {worst}");
    assert_eq!(cache.len(), CONTEXT);

    // prompts that fill the context
    let long: Vec<u32> = all[..CONTEXT].to_vec();
    let err = generate(
        &model,
        &tok,
        &long,
        &mut Sampler::new(SamplingParams::greedy()),
        4,
        &[],
        |_| std::ops::ControlFlow::Continue(()),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the prompt has 64 tokens; the model's context holds 64"
    );
    let (tokens, reason) = greedy(&model, &tok, &all[..CONTEXT - 1], 4);
    assert_eq!((tokens.len(), reason), (2, "context full"));
    // max_tokens that exactly fill the context: the stop is max tokens
    let (tokens, reason) = greedy(&model, &tok, &prompt, CONTEXT + 1 - p);
    assert_eq!((tokens.len(), reason), (CONTEXT + 1 - p, "max tokens"));
    // a callback that breaks ends the generation at that piece
    let mut pieces = 0;
    let mut sampler = Sampler::new(SamplingParams::greedy());
    let stats = generate(
        &model,
        &tok,
        &prompt,
        &mut sampler,
        CONTEXT + 1 - p,
        &[],
        |_| {
            pieces += 1;
            if pieces == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    )
    .unwrap();
    assert_eq!((pieces, stats.stop_reason), (3, "cancelled"));
    assert!(
        stats.tokens.len() < CONTEXT + 1 - p,
        "{}",
        stats.tokens.len()
    );
}

#[test]
fn generation_stops_at_the_end_of_the_context_on_the_cpu() {
    let _serial = lock_device_state();
    check_context(&Device::cpu());
}

#[test]
fn generation_stops_at_the_end_of_the_context_on_the_gpu() {
    let _serial = lock_device_state();
    if let Some(dev) = first_gpu() {
        check_context(&dev);
    }
}
