//! `silica quantize`, run as the built binary: a small GGUF written here is
//! converted to every type and read back (types, shapes, metadata, values
//! within each format's rounding error); a synthetic model is written,
//! reproducibly, and generates; bad input gives one `error:` line and exit
//! status 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use silica_models::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};

fn silica(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_silica"))
        .args(args)
        .env_remove("SILICA_DEVICE")
        .env_remove("RUST_LOG")
        .output()
        .expect("the silica binary runs")
}

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("quantize_{name}"))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// `n` values of a fixed pseudo-random pattern in [-1, 1), with a few
/// larger ones.
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let v = x as f32 / u32::MAX as f32 * 2.0 - 1.0;
            if i % 97 == 0 { v * 8.0 } else { v }
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The input: tensor name, row-major shape, stored type, its f32 values.
struct Input {
    path: PathBuf,
    tensors: Vec<(&'static str, Vec<usize>, GgmlType, Vec<f32>)>,
    metadata: Vec<(String, MetaValue)>,
}

fn write_input(path: PathBuf) -> Input {
    let f16_values: Vec<f32> = values(32 * 64, 2)
        .iter()
        .map(|&v| half::f16::from_f32(v).to_f32())
        .collect();
    let tensors = vec![
        (
            "token_embd.weight",
            vec![64, 64],
            GgmlType::F32,
            values(64 * 64, 1),
        ),
        (
            "blk.0.attn_q.weight",
            vec![32, 64],
            GgmlType::F16,
            f16_values,
        ),
        (
            "blk.0.attn_norm.weight",
            vec![64],
            GgmlType::F32,
            values(64, 3),
        ),
        ("odd.weight", vec![4, 48], GgmlType::F32, values(4 * 48, 4)),
        (
            "blk.0.ffn_up.weight",
            vec![2, 8, 32],
            GgmlType::F32,
            values(512, 5),
        ),
    ];
    let metadata = vec![
        (
            "general.architecture".to_string(),
            MetaValue::String("llama".into()),
        ),
        ("general.file_type".into(), MetaValue::U32(0)),
        ("general.alignment".into(), MetaValue::U32(64)),
        ("llama.rope.freq_base".into(), MetaValue::F32(10000.0)),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(vec![
                MetaValue::String("a".into()),
                MetaValue::String("b".into()),
            ]),
        ),
        ("test.i64".into(), MetaValue::I64(-5)),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &metadata {
        w.metadata(k.as_str(), v.clone()).unwrap();
    }
    for (name, shape, ty, v) in &tensors {
        let bytes = match ty {
            GgmlType::F16 => v
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            _ => f32_bytes(v),
        };
        w.add_tensor(*name, shape, *ty, bytes).unwrap();
    }
    // An integer tensor silica cannot decode: copied unchanged.
    w.add_tensor("ids", &[6], GgmlType::Other(26), vec![9; 24])
        .unwrap();
    w.write_to_path(&path).unwrap();
    Input {
        path,
        tensors,
        metadata,
    }
}

/// The largest error a value may have after rounding to `ty`, as a fraction
/// of the largest magnitude in its block of 32.
fn tolerance(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 1e-3,
        GgmlType::Q8_0 => 0.5 / 127.0 + 1e-3,
        GgmlType::Q4_0 => 1.0 / 8.0 + 1e-3, // the clamped +8 side
        GgmlType::Q4_1 => 2.0 / 30.0 + 2e-3, // half a step of (max - min) / 15
        // half a step, plus the 6-bit rounding of the sub-block scale and min
        GgmlType::Q4_K => 0.25,
        other => panic!("no tolerance for {other}"),
    }
}

fn check_values(name: &str, ty: GgmlType, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}");
    for (b, (g, w)) in got.chunks(32).zip(want.chunks(32)).enumerate() {
        let amax = w.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let bound = tolerance(ty) * amax;
        for (i, (g, w)) in g.iter().zip(w).enumerate() {
            assert!(
                (g - w).abs() <= bound,
                "{name} as {ty}: element {} is {g}, want {w} (bound {bound})",
                b * 32 + i
            );
        }
    }
}

#[test]
fn converts_a_gguf_to_every_type() {
    let input = write_input(tmp("input.gguf"));
    let cases = [
        ("q8_0", GgmlType::Q8_0, 7),
        ("q4_0", GgmlType::Q4_0, 2),
        ("q4_1", GgmlType::Q4_1, 3),
        ("f16", GgmlType::F16, 1),
        ("f32", GgmlType::F32, 0),
        ("q4_k", GgmlType::Q4_K, 14),
    ];
    for (name, ty, file_type) in cases {
        let output = tmp(&format!("out_{name}.gguf"));
        let out = silica(&["quantize", s(&input.path), s(&output), "--type", name]);
        assert!(out.status.success(), "{name}: {out:?}");
        assert!(!tmp(&format!("out_{name}.gguf.partial")).exists());
        let f = GgufFile::open(&output).unwrap();

        // metadata: the same, in order, but for the file type (and the
        // quantization version, added after it for quantized types)
        assert_eq!(f.get_u64("general.file_type").unwrap(), file_type);
        assert_eq!(f.alignment(), 64);
        let quantized = !matches!(ty, GgmlType::F32 | GgmlType::F16);
        assert_eq!(
            f.get("general.quantization_version").is_some(),
            quantized,
            "{name}"
        );
        let kept: Vec<_> = f
            .metadata()
            .iter()
            .filter(|(k, _)| k != "general.file_type" && k != "general.quantization_version")
            .cloned()
            .collect();
        let want: Vec<_> = input
            .metadata
            .iter()
            .filter(|(k, _)| k != "general.file_type")
            .cloned()
            .collect();
        assert_eq!(kept, want, "{name}");

        for (tensor, shape, _, values) in &input.tensors {
            use GgmlType::*;
            let whole_256 = shape.last().is_some_and(|r| r % 256 == 0);
            let expected_type = match (*tensor, ty) {
                ("blk.0.attn_norm.weight", _) => F32,
                ("odd.weight", F16) => F16,
                ("odd.weight", _) => F32,
                ("token_embd.weight", Q4_0 | Q4_1 | Q4_K) => Q8_0,
                (_, Q4_K) if !whole_256 => Q8_0,
                _ => ty,
            };
            let info = f.tensor_info(tensor).unwrap();
            assert_eq!(info.ggml_type, expected_type, "{name}: {tensor}");
            assert_eq!(info.shape(), *shape, "{name}: {tensor}");
            let (got_shape, got) = f.dequantize(tensor).unwrap();
            assert_eq!(got_shape, *shape);
            check_values(tensor, expected_type, &got, values);
        }
        let ids = f.tensor_info("ids").unwrap();
        assert_eq!(ids.ggml_type, GgmlType::Other(26));
        assert_eq!(f.tensor_bytes(ids), [9; 24]);
        std::fs::remove_file(&output).unwrap();
    }
    std::fs::remove_file(&input.path).unwrap();
}

#[test]
fn a_synthetic_model_is_reproducible_and_generates() {
    let a = tmp("smollm2_a.gguf");
    let b = tmp("smollm2_b.gguf");
    for path in [&a, &b] {
        let out = silica(&[
            "quantize",
            "--synthetic",
            "smollm2-135m",
            s(path),
            "--type",
            "q4_0",
            "--seed",
            "7",
        ]);
        assert!(out.status.success(), "{out:?}");
    }
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "the same seed gives the same file"
    );

    let f = GgufFile::open(&a).unwrap();
    assert_eq!(f.get_u64("llama.block_count").unwrap(), 30);
    assert_eq!(f.get_u64("llama.embedding_length").unwrap(), 576);
    assert_eq!(f.get_u64("general.file_type").unwrap(), 2);
    assert_eq!(f.tensors().len(), 2 + 30 * 9);
    let embd = f.tensor_info("token_embd.weight").unwrap();
    assert_eq!(embd.shape(), [49152, 576]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    let q = f.tensor_info("blk.29.attn_q.weight").unwrap();
    assert_eq!(q.ggml_type, GgmlType::Q4_0);
    let k = f.tensor_info("blk.0.attn_k.weight").unwrap();
    assert_eq!(k.shape(), [192, 576]);
    assert!(f.tensor_info("output.weight").is_none(), "tied embeddings");
    let (_, norm) = f.dequantize("output_norm.weight").unwrap();
    assert!(norm.iter().all(|&v| v == 1.0));
    let (_, w) = f.dequantize("blk.3.ffn_down.weight").unwrap();
    let std = (w.iter().map(|v| v * v).sum::<f32>() / w.len() as f32).sqrt();
    assert!(
        (0.018..0.022).contains(&std),
        "weights N(0, 0.02): std {std}"
    );

    let out = silica(&[
        "generate",
        "--model",
        s(&a),
        "hi",
        "--max-tokens",
        "4",
        "--device",
        "cpu",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("hi"));
    std::fs::remove_file(&a).unwrap();
    std::fs::remove_file(&b).unwrap();
}

/// Runs `args`, expecting exit status 2 and exactly one `error:` line.
fn fails(args: &[&str], what: &str) {
    let out = silica(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
    assert!(lines[0].contains(what), "{args:?}: {stderr}");
}

#[test]
fn bad_input_is_one_error_line() {
    let out = tmp("bad_out.gguf");
    let missing = tmp("missing.gguf");
    fails(&["quantize", s(&missing), s(&out)], "no such file");

    let text = tmp("not_gguf.txt");
    std::fs::write(&text, "hello, this is not a GGUF file at all").unwrap();
    fails(&["quantize", s(&text), s(&out)], "not a GGUF file");

    let input = write_input(tmp("bad_input.gguf"));
    fails(
        &["quantize", s(&input.path), s(&out), "--type", "q3_k"],
        "unknown --type \"q3_k\"",
    );
    fails(
        &["quantize", "--synthetic", "gpt-5", s(&out)],
        "unknown --synthetic model",
    );
    fails(
        &[
            "quantize",
            "--synthetic",
            "llama-1b",
            s(&input.path),
            s(&out),
        ],
        "--synthetic takes one path",
    );
    fails(&["quantize", s(&out)], "give INPUT and OUTPUT");
    let no_dir = Path::new("/nonexistent-dir/out.gguf");
    fails(&["quantize", s(&input.path), s(no_dir)], "nonexistent-dir");

    assert!(!out.exists());
    assert!(!tmp("bad_out.gguf.partial").exists());
    std::fs::remove_file(&text).unwrap();
    std::fs::remove_file(&input.path).unwrap();
}
