//! `--lora`, run as the built binary on SmolLM2-135M-Instruct with the
//! golden adapter of silica-models (tests/golden/lora/): `silica quantize
//! --lora` merges it into a plain GGUF whose logits (f32) and greedy
//! tokens (f32, Q8_0) are the reference's with the adapter
//! (scripts/lora_golden.py), which the runtime adapter matches too
//! (silica-models' tests/lora.rs); `silica generate
//! --lora` runs with it; adapters that do not fit give one `error:` line
//! and exit status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use silica::{DType, Device};
use silica_models::gguf::GgufFile;
use silica_models::llama::Llama;
use silica_models::resolve::resolve_decoder;

fn silica(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_silica"))
        .args(args)
        .env_remove("SILICA_DEVICE")
        .env_remove("RUST_LOG")
        .output()
        .expect("the silica binary runs")
}

fn adapter_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../silica-models/tests/golden/lora")
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lora_{name}"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("paths are UTF-8")
}

fn golden() -> Value {
    let text = std::fs::read_to_string(adapter_dir().join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// `n` greedy tokens after `ids` on the CPU.
fn greedy(model: &Llama, ids: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut logits: Vec<f32> = model
        .forward(ids, &mut cache, true)
        .unwrap()
        .to_vec()
        .unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let next = argmax(&logits);
        out.push(next);
        logits = model
            .forward(&[next], &mut cache, true)
            .unwrap()
            .to_vec()
            .unwrap();
    }
    out
}

#[test]
fn merged_gguf_generates_the_runtime_adapters_tokens() {
    // the exact products, as the reference (tests/llama.rs)
    silica::set_cpu_int8_activations(false);
    let base = resolve_decoder(None).expect("the default decoder resolves");
    let g = golden();
    let ids = u32s(&g["ids"]);
    let want = u32s(&g["scale_1"]["greedy"]);
    for ty in ["f32", "q8_0"] {
        let out = tmp(&format!("merged_{ty}.gguf"));
        let lora = format!("{}:1", s(&adapter_dir()));
        let r = silica(&["quantize", s(&base), s(&out), "--type", ty, "--lora", &lora]);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let f = GgufFile::open(&out).unwrap();
        assert!(f.get("adapter.type").is_none());
        let model = Llama::load(&f, &Device::cpu(), DType::F32).unwrap();
        if ty == "f32" {
            // W + B·A in f32 is what the reference computes
            let vocab = model.config.vocab_size;
            let logits: Vec<f32> = model
                .forward(&ids, &mut model.new_cache(), false)
                .unwrap()
                .to_vec()
                .unwrap();
            let rows = g["scale_1"]["logits"].as_array().unwrap();
            for (p, row) in rows.iter().enumerate() {
                for (i, w) in row.as_array().unwrap().iter().enumerate() {
                    let d = (logits[p * vocab + i] - w.as_f64().unwrap() as f32).abs();
                    assert!(
                        d <= 2e-3,
                        "merged f32: logit {i} of position {p} off by {d}"
                    );
                }
            }
        }
        let got = greedy(&model, &ids, want.len());
        assert_eq!(
            got, want,
            "merged {ty}: greedy tokens differ from the reference's"
        );
        drop(model);
        drop(f);
        std::fs::remove_file(out).ok();
    }
}

#[test]
fn generate_takes_adapters_and_rejects_bad_ones() {
    let adapter = adapter_dir();
    let gguf_adapter = adapter.join("adapter.gguf");
    let two = [
        "generate",
        "Once upon a time",
        "--device",
        "cpu",
        "--temperature",
        "0",
        "--max-tokens",
        "4",
        "--lora",
        s(&adapter),
        "--lora",
        &format!("{}:0.5", s(&gguf_adapter)),
    ];
    let r = silica(&two);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(
        err.contains("LoRA adapter") && err.contains("scale 0.5"),
        "{err}"
    );

    let base = resolve_decoder(None).unwrap();
    let missing = tmp("no-such-adapter");
    let bad_scale = format!("{}:x", s(&adapter));
    let cases: [(&str, &str); 3] = [
        (s(&missing), "no such file"),
        (s(&base), "not a LoRA adapter"),
        // `:x` is not a scale, so the whole is a path
        (&bad_scale, "no such file"),
    ];
    for (arg, needle) in cases {
        let r = silica(&[
            "generate",
            "Hi",
            "--device",
            "cpu",
            "--max-tokens",
            "1",
            "--lora",
            arg,
        ]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{arg}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{arg}: {err}"
        );
    }
}
