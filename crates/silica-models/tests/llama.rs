//! SmolLM2-135M-Instruct (the default decoder) against an independent
//! reference: logits and greedy continuations computed by Hugging Face
//! transformers on the same dequantized weights (scripts/reference_smollm2.py,
//! output in tests/golden/smollm2.json), on the CPU and on every GPU adapter.

use serde_json::Value;
use silica::{DType, Device};
use silica_models::generate::generate;
use silica_models::gguf::GgufFile;
use silica_models::llama::{Llama, LoadOptions};
use silica_models::resolve::resolve_decoder;
use silica_models::sampling::{Sampler, SamplingParams, argmax};
use silica_models::tokenizer::Tokenizer;

#[path = "common/decoder.rs"]
mod decoder;
use decoder::{golden, greedy, ids_of};

const MAX_ABS_ERR: f32 = 1e-3;

/// Devices to check: the CPU and every GPU adapter (a failure, not a skip,
/// when `SILICA_REQUIRE_GPU=1` and there is none).
fn devices() -> Vec<Device> {
    let mut out = vec![Device::cpu()];
    let n = silica::adapters().len();
    if n == 0 {
        assert!(
            std::env::var("SILICA_REQUIRE_GPU").as_deref() != Ok("1"),
            "SILICA_REQUIRE_GPU=1 but no GPU adapter"
        );
        eprintln!("no GPU adapter: CPU only");
    }
    for i in 0..n {
        let dev = Device::gpu(i).expect("the adapter opens");
        // the exact decode products (tests/int8_activations.rs checks the
        // 8-bit ones, the default through Vulkan)
        if let Device::Gpu(g) = &dev {
            g.set_int8_activations(false);
        }
        out.push(dev);
    }
    out
}

fn check_on(dev: &Device, gguf: &GgufFile, golden: &Value) {
    let model = Llama::load(gguf, dev, DType::F32).unwrap();
    let vocab = model.config.vocab_size;
    for prompt in golden["prompts"].as_array().unwrap() {
        let name = prompt["name"].as_str().unwrap();
        let ids = ids_of(&prompt["ids"]);
        let mut cache = model.new_cache();
        let logits: Vec<f32> = model
            .forward(&ids, &mut cache, false)
            .unwrap()
            .to_vec()
            .unwrap();
        assert_eq!(logits.len(), ids.len() * vocab);
        let mut worst = 0f32;
        for pos in prompt["positions"].as_array().unwrap() {
            let p = pos["position"].as_u64().unwrap() as usize;
            let row = &logits[p * vocab..(p + 1) * vocab];
            for (i, want) in pos["logits_first_512"]
                .as_array()
                .unwrap()
                .iter()
                .enumerate()
            {
                worst = worst.max((row[i] - want.as_f64().unwrap() as f32).abs());
            }
            assert_eq!(
                argmax(row) as u64,
                pos["argmax"].as_u64().unwrap(),
                "{dev} {name} position {p}"
            );
        }
        let last = prompt["last_position"].as_u64().unwrap() as usize;
        let row = &logits[last * vocab..(last + 1) * vocab];
        for pair in prompt["last_top50"].as_array().unwrap() {
            let (id, want) = (
                pair[0].as_u64().unwrap() as usize,
                pair[1].as_f64().unwrap() as f32,
            );
            worst = worst.max((row[id] - want).abs());
        }
        assert!(
            worst <= MAX_ABS_ERR,
            "{dev} {name}: logits differ by {worst} (limit {MAX_ABS_ERR})"
        );

        // greedy continuation with the KV cache, one token at a time
        // (the reference stops early at an end-of-sequence token, which is compared too)
        let want = ids_of(&prompt["greedy"]["ids"]);
        let at_eos = prompt["greedy"]["stopped_at_eos"]
            .as_bool()
            .unwrap_or(false);
        assert!(
            want.len() >= 24 || at_eos,
            "{name}: the golden continuation is too short"
        );
        let mut got = Vec::new();
        let mut next = argmax(row);
        while got.len() < want.len() {
            got.push(next);
            let l: Vec<f32> = model
                .forward(&[next], &mut cache, true)
                .unwrap()
                .to_vec()
                .unwrap();
            next = argmax(&l);
        }
        assert_eq!(got, want, "{dev} {name}: greedy tokens differ");

        // `generate` does the same; on a GPU it queues each step on the
        // token still on the device, before reading it back
        let tokenizer = Tokenizer::from_gguf(gguf).unwrap();
        let mut sampler = Sampler::new(SamplingParams::greedy());
        let stats = generate(
            &model,
            &tokenizer,
            &ids,
            &mut sampler,
            want.len(),
            &[],
            |_| std::ops::ControlFlow::Continue(()),
        )
        .unwrap();
        let n = stats.tokens.len();
        assert!(
            n == want.len() || (stats.stop_reason == "eos" && at_eos),
            "{dev} {name}: generate stopped after {n} tokens ({})",
            stats.stop_reason
        );
        assert_eq!(
            stats.tokens,
            want[..n],
            "{dev} {name}: generate's tokens differ"
        );
        eprintln!(
            "{dev} {name}: logits within {worst:.2e} of the reference, {} greedy tokens identical",
            got.len()
        );
    }
}

#[test]
fn smollm2_matches_the_reference_on_every_device() {
    // the CPU's exact products: its default 8-bit activations (Q4_1, as
    // llama.cpp) move logits by more than MAX_ABS_ERR
    silica::set_cpu_int8_activations(false);
    let path = resolve_decoder(None).expect("the default decoder resolves");
    let gguf = GgufFile::open(&path).unwrap();
    let golden = golden();
    let longest = golden["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["greedy"]["ids"].as_array().unwrap().len());
    assert!(
        longest.max().unwrap() >= 24,
        "no golden continuation of 24 tokens or more"
    );
    for dev in devices() {
        check_on(&dev, &gguf, &golden);
    }
}

/// Greedy tokens with the weights kept quantized on the device (the
/// default) and with every weight decoded to f32 at load are identical:
/// 32 tokens after each golden prompt on the CPU, 24 after the first on
/// every GPU (software GPUs are slow; the quantized path is also checked
/// against the reference above on every device).
#[test]
fn quantized_weights_generate_what_dequantized_ones_do() {
    // the weights' quantization alone: the CPU's exact products, not its
    // default 8-bit activations (which the dequantized model does not use)
    silica::set_cpu_int8_activations(false);
    let path = resolve_decoder(None).expect("the default decoder resolves");
    let gguf = GgufFile::open(&path).unwrap();
    let golden = golden();
    for dev in devices() {
        let opts = |dequantize| LoadOptions {
            dtype: DType::F32,
            dequantize,
        };
        let quantized = Llama::load_with(&gguf, &dev, opts(false)).unwrap();
        let reference = Llama::load_with(&gguf, &dev, opts(true)).unwrap();
        let prompts = golden["prompts"].as_array().unwrap();
        let (prompts, n) = match dev {
            Device::Cpu => (&prompts[..], 32),
            _ => (&prompts[..1], 24),
        };
        for prompt in prompts {
            let ids = ids_of(&prompt["ids"]);
            assert_eq!(
                greedy(&quantized, &ids, n, None).0,
                greedy(&reference, &ids, n, None).0,
                "{dev} {}: quantized and dequantized weights disagree",
                prompt["name"]
            );
        }
    }
}

/// Half-precision compute: the logits still come back as f32 and the greedy
/// continuation of P1 starts like the reference's (regression test: f16
/// generation used to fail reading f16 logits as f32).
#[test]
fn smollm2_runs_in_f16_and_bf16() {
    let path = resolve_decoder(None).expect("the default decoder resolves");
    let gguf = GgufFile::open(&path).unwrap();
    let golden = golden();
    let p1 = &golden["prompts"][0];
    let ids = ids_of(&p1["ids"]);
    let want = ids_of(&p1["greedy"]["ids"]);
    for dtype in [DType::F16, DType::BF16] {
        let model = Llama::load(&gguf, &Device::cpu(), dtype).unwrap();
        let mut cache = model.new_cache();
        let logits = model.forward(&ids, &mut cache, true).unwrap();
        assert_eq!(logits.dtype(), DType::F32);
        let mut next = argmax(&logits.to_vec::<f32>().unwrap());
        let mut got = vec![next];
        for _ in 0..3 {
            next = argmax(
                &model
                    .forward(&[next], &mut cache, true)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap(),
            );
            got.push(next);
        }
        assert_eq!(
            got,
            want[..4],
            "{dtype}: the first greedy tokens differ from the f32 reference"
        );
    }
}
