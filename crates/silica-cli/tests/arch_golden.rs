//! The architecture variants silica decodes (Llama 3.1's rotary frequency
//! factors, YaRN scaling, Qwen3's head norms and head size, Gemma 2 and 3,
//! Phi-3's stacked tensors, LongRoPE and partial rotation) against
//! llama.cpp: each tiny model is written by `silica quantize --synthetic`
//! exactly as `scripts/arch_golden.py` wrote it for llama.cpp, and silica's
//! logits on the CPU and on every GPU adapter must match the golden ones.

use std::path::{Path, PathBuf};
use std::process::Command;

use silica::{DType, Device};
use silica_models::llama::Llama;

/// One golden file: the shape, its tokens, llama.cpp's top token at every
/// position and its logits at a few positions.
struct Golden {
    shape: String,
    tokens: Vec<u32>,
    argmax: Vec<usize>,
    logits: Vec<(usize, Vec<f32>)>,
}

fn read_golden(path: &Path) -> Golden {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut g = Golden {
        shape: String::new(),
        tokens: Vec::new(),
        argmax: Vec::new(),
        logits: Vec::new(),
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let mut words = line.split_whitespace();
        let nums = |w: std::str::SplitWhitespace<'_>| -> Vec<f64> {
            w.map(|v| v.parse::<f64>().expect("a number")).collect()
        };
        match words.next() {
            Some("shape") => g.shape = words.next().expect("a shape name").to_string(),
            Some("tokens") => g.tokens = nums(words).into_iter().map(|v| v as u32).collect(),
            Some("argmax") => g.argmax = nums(words).into_iter().map(|v| v as usize).collect(),
            Some("logits") => {
                let v = nums(words);
                g.logits
                    .push((v[0] as usize, v[1..].iter().map(|&x| x as f32).collect()));
            }
            other => panic!("{}: unexpected line {other:?}", path.display()),
        }
    }
    g
}

fn goldens() -> Vec<Golden> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the golden folder")
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("arch_"))
        })
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "golden files in {}: {files:?}",
        dir.display()
    );
    files.iter().map(|p| read_golden(p)).collect()
}

/// Writes the tiny model `shape` as the script did.
fn write_model(shape: &str) -> PathBuf {
    write_model_as(shape, "f32")
}

/// Writes the tiny model `shape` with weights of type `ty`.
fn write_model_as(shape: &str, ty: &str) -> PathBuf {
    let name = match ty {
        "f32" => format!("arch_{shape}.gguf"),
        _ => format!("arch_{shape}_{ty}.gguf"),
    };
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let out = Command::new(env!("CARGO_BIN_EXE_silica"))
        .args(["quantize", "--synthetic", shape])
        .arg(&path)
        .args(["--type", ty])
        .output()
        .expect("the silica binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn devices() -> Vec<Device> {
    let mut devs = vec![Device::Cpu];
    let require = std::env::var("SILICA_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let n = silica::adapters().len();
    assert!(n > 0 || !require, "SILICA_REQUIRE_GPU=1 but no adapter");
    devs.extend((0..n).map(|i| Device::gpu(i).expect("the adapter opens")));
    devs
}

/// Every position's logits `[tokens, vocab]` of `tokens` fed in `pieces`
/// (lengths that sum to the tokens'), one forward step each.
fn logits_in_pieces(model: &Llama, tokens: &[u32], pieces: &[usize]) -> Vec<f32> {
    let mut cache = model.new_cache();
    let mut all = Vec::new();
    let mut at = 0;
    for &n in pieces {
        let logits = model
            .forward(&tokens[at..at + n], &mut cache, false)
            .expect("forward");
        all.extend(logits.to_vec::<f32>().expect("logits"));
        at += n;
    }
    assert_eq!(at, tokens.len());
    all
}

/// The largest difference between silica's logits `all` and the golden
/// ones over the golden positions, relative to 1 + the largest golden
/// logit of the position, and where it is.
fn worst_error(g: &Golden, all: &[f32], vocab: usize) -> (f32, usize) {
    let mut worst = (0.0f32, 0);
    for (p, want) in &g.logits {
        let got = &all[p * vocab..(p + 1) * vocab];
        let spread = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        let err = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max)
            / (1.0 + spread);
        if err > worst.0 {
            worst = (err, *p);
        }
    }
    worst
}

#[test]
fn tiny_architectures_match_llama_cpp_on_every_device() {
    for g in goldens() {
        let path = write_model(&g.shape);
        for dev in devices() {
            let what = format!("{} on {dev}", g.shape);
            let model = Llama::from_path(&path, &dev, DType::F32).expect("the model loads");
            let vocab = model.config.vocab_size;
            let n = g.tokens.len();
            let all = logits_in_pieces(&model, &g.tokens, &[n]);
            assert_eq!(all.len(), n * vocab, "{what}");
            // 3 tokens, 17 more (from position 3, past a window of 8), then
            // one at a time (the decode step)
            let mut pieces = vec![3, 17];
            pieces.resize(n - 20 + 2, 1);
            let stepped = logits_in_pieces(&model, &g.tokens, &pieces);
            for (how, logits) in [("in one step", &all), ("in pieces", &stepped)] {
                let (worst, p) = worst_error(&g, logits, vocab);
                eprintln!(
                    "{what}, {how}: logits within {worst:.1e} of llama.cpp's \
                     (relative to 1 + the largest), worst at position {p}"
                );
                assert!(
                    worst <= 2e-3,
                    "{what}, {how}, position {p}: logits differ from llama.cpp's by {worst} \
                     of 1 + the largest logit"
                );
            }
            // the top token at every position, where llama.cpp's lead is clear
            for (p, &want) in g.argmax.iter().enumerate() {
                let row = &all[p * vocab..(p + 1) * vocab];
                let (best, _) =
                    row.iter()
                        .enumerate()
                        .fold(
                            (0, f32::NEG_INFINITY),
                            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                        );
                let lead = row[best] - row[want];
                assert!(
                    best == want || lead < 1e-3,
                    "{what}, position {p}: top token {best}, llama.cpp's {want} (behind by {lead})"
                );
            }
        }
    }
}

/// Phi-3's stacked Q/K/V rows, reordered at load for a partial rotation,
/// move as whole rows of blocks when they stay quantized: the quantized
/// model's logits are those of the same file decoded at load (the path the
/// goldens check), the CPU's products exact.
#[test]
fn quantized_phi_rows_match_their_decoded_copy() {
    use silica_models::gguf::GgufFile;
    use silica_models::llama::LoadOptions;
    silica::set_cpu_int8_activations(false);
    let tokens: Vec<u32> = (0..20).map(|i| 259 + 7 * i).collect();
    for shape in ["tiny-phi3", "tiny-phi4"] {
        let f = GgufFile::open(write_model_as(shape, "q8_0")).expect("the model opens");
        for dev in devices() {
            let logits = |dequantize| {
                let opts = LoadOptions {
                    dtype: DType::F32,
                    dequantize,
                };
                let model = Llama::load_with(&f, &dev, opts).expect("the model loads");
                logits_in_pieces(&model, &tokens, &[12, 1, 7])
            };
            let (quant, dense) = (logits(false), logits(true));
            let worst = quant
                .iter()
                .zip(&dense)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst < 1e-3,
                "{shape} on {dev}: quantized and decoded logits differ by {worst}"
            );
        }
    }
}

/// A copy of the tiny model `shape` with metadata changed by `edit` (a key
/// set to `Some` value, or removed with `None`) and tensors renamed or
/// replaced by `tensor` (name, shape, values in f32; `None` drops it).
fn variant(
    shape: &str,
    tag: &str,
    edit: &[(&str, Option<silica_models::gguf::MetaValue>)],
    tensor: Option<(&str, Option<Vec<f32>>)>,
) -> PathBuf {
    use silica_models::gguf::{GgmlType, GgufFile, GgufWriter};
    let src = GgufFile::open(write_model(shape)).expect("the model opens");
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if !edit.iter().any(|(e, _)| e == k) {
            w.metadata(k.clone(), v.clone()).unwrap();
        }
    }
    for (k, v) in edit {
        if let Some(v) = v {
            w.metadata(*k, v.clone()).unwrap();
        }
    }
    for info in src.tensors() {
        match &tensor {
            Some((name, replace)) if *name == info.name => {
                if let Some(values) = replace {
                    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    w.add_tensor(info.name.clone(), &[values.len()], GgmlType::F32, bytes)
                        .unwrap();
                }
            }
            _ => {
                let data = src.tensor_bytes(info).to_vec();
                w.add_tensor(info.name.clone(), &info.shape(), info.ggml_type, data)
                    .unwrap();
            }
        }
    }
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("arch_bad_{tag}.gguf"));
    w.write_to_path(&path).unwrap();
    path
}

/// Bad or inconsistent architecture metadata is a one-line error with exit
/// status 2 that names what is wrong, never a panic.
#[test]
fn bad_architecture_metadata_is_a_clear_error() {
    use silica_models::gguf::MetaValue;
    let s = |v: &str| Some(MetaValue::String(v.into()));
    let u = |v: u32| Some(MetaValue::U32(v));
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        (
            "unknown scaling",
            variant(
                "tiny-yarn",
                "scaling",
                &[("llama.rope.scaling.type", s("longrope2"))],
                None,
            ),
            "rope scaling \"longrope2\"",
        ),
        (
            "yarn without its original context",
            variant(
                "tiny-yarn",
                "yarn_ctx",
                &[("llama.rope.scaling.original_context_length", None)],
                None,
            ),
            "llama.rope.scaling.original_context_length",
        ),
        (
            "a negative yarn factor",
            variant(
                "tiny-yarn",
                "yarn_factor",
                &[("llama.rope.scaling.factor", Some(MetaValue::F32(-2.0)))],
                None,
            ),
            "llama.rope.scaling.factor is -2",
        ),
        (
            "rope_freqs of the wrong length",
            variant(
                "tiny-llama3",
                "freqs_len",
                &[],
                Some(("rope_freqs.weight", Some(vec![1.0; 5]))),
            ),
            "rope_freqs.weight has shape [5], expected [8]",
        ),
        (
            "a zero rope_freqs factor",
            variant(
                "tiny-llama3",
                "freqs_zero",
                &[],
                Some(("rope_freqs.weight", Some(vec![0.0; 8]))),
            ),
            "rope_freqs.weight holds 0",
        ),
        (
            "a head size that does not fit the heads' tensors",
            variant(
                "tiny-qwen3",
                "key_length",
                &[
                    ("qwen3.attention.key_length", u(24)),
                    ("qwen3.attention.value_length", u(24)),
                    ("qwen3.rope.dimension_count", u(24)),
                ],
                None,
            ),
            "has shape [128, 64], expected [96, 64]",
        ),
        (
            "an odd head size",
            variant(
                "tiny-qwen3",
                "odd_head",
                &[
                    ("qwen3.attention.key_length", u(31)),
                    ("qwen3.attention.value_length", u(31)),
                ],
                None,
            ),
            "head size 31",
        ),
        (
            "value heads unlike key heads",
            variant(
                "tiny-qwen3",
                "value_length",
                &[("qwen3.attention.value_length", u(16))],
                None,
            ),
            "value heads of 16",
        ),
        (
            "no head norm in Qwen3",
            variant(
                "tiny-qwen3",
                "no_norm",
                &[],
                Some(("blk.0.attn_k_norm.weight", None)),
            ),
            "blk.0.attn_k_norm.weight",
        ),
        (
            "partial rotation",
            variant(
                "tiny-qwen3",
                "partial",
                &[("qwen3.rope.dimension_count", u(16))],
                None,
            ),
            "partial rotation",
        ),
        (
            "a window of 0",
            variant(
                "tiny-gemma3",
                "window_zero",
                &[("gemma3.attention.sliding_window", u(0))],
                None,
            ),
            "gemma3.attention.sliding_window is 0",
        ),
        (
            "a window that is not a number",
            variant(
                "tiny-gemma3",
                "window_type",
                &[("gemma3.attention.sliding_window", s("512"))],
                None,
            ),
            "gemma3.attention.sliding_window",
        ),
        (
            "a per-layer window pattern of the wrong length",
            variant(
                "tiny-gemma3",
                "pattern_len",
                &[(
                    "gemma3.attention.sliding_window_pattern",
                    Some(MetaValue::Array(vec![MetaValue::Bool(true); 2])),
                )],
                None,
            ),
            "gemma3.attention.sliding_window_pattern has 2 entries for 3 layers",
        ),
        (
            "no post-norm in Gemma 3",
            variant(
                "tiny-gemma3",
                "no_post_norm",
                &[],
                Some(("blk.1.post_ffw_norm.weight", None)),
            ),
            "blk.1.post_ffw_norm.weight",
        ),
        (
            "no window in Gemma 2",
            variant(
                "tiny-gemma2",
                "no_window",
                &[("gemma2.attention.sliding_window", None)],
                None,
            ),
            "gemma2.attention.sliding_window",
        ),
        (
            "no attention soft-cap in Gemma 2",
            variant(
                "tiny-gemma2",
                "no_softcap",
                &[("gemma2.attn_logit_softcapping", None)],
                None,
            ),
            "gemma2.attn_logit_softcapping",
        ),
        (
            "a negative final soft-cap",
            variant(
                "tiny-gemma2",
                "neg_softcap",
                &[(
                    "gemma2.final_logit_softcapping",
                    Some(MetaValue::F32(-30.0)),
                )],
                None,
            ),
            "gemma2.final_logit_softcapping is -30",
        ),
        (
            "a zero local RoPE base",
            variant(
                "tiny-gemma2",
                "swa_base",
                &[("gemma2.rope.freq_base_swa", Some(MetaValue::F32(0.0)))],
                None,
            ),
            "gemma2.rope.freq_base_swa is 0",
        ),
        (
            "LongRoPE factors of the wrong length",
            variant(
                "tiny-phi3",
                "phi_long_len",
                &[],
                Some(("rope_factors_long.weight", Some(vec![1.0; 5]))),
            ),
            "rope_factors_long.weight has shape [5], expected [8]",
        ),
        (
            "a zero LongRoPE factor among those not used",
            variant(
                "tiny-phi3",
                "phi_short_zero",
                &[],
                Some(("rope_factors_short.weight", Some(vec![0.0; 8]))),
            ),
            "rope_factors_short.weight holds 0",
        ),
        (
            "long LongRoPE factors without the short ones",
            variant(
                "tiny-phi3",
                "phi_no_short",
                &[],
                Some(("rope_factors_short.weight", None)),
            ),
            "tensor 'rope_factors_short.weight' (the file has rope_factors_long.weight)",
        ),
        (
            "an odd rotary dimension",
            variant(
                "tiny-phi4",
                "phi_rope_odd",
                &[("phi3.rope.dimension_count", u(11))],
                None,
            ),
            "phi3.rope.dimension_count is 11",
        ),
        (
            "a rotary dimension wider than the head",
            variant(
                "tiny-phi4",
                "phi_rope_wide",
                &[("phi3.rope.dimension_count", u(32))],
                None,
            ),
            "phi3.rope.dimension_count is 32",
        ),
        (
            "a negative attention factor",
            variant(
                "tiny-phi3",
                "phi_attn_factor",
                &[("phi3.rope.scaling.attn_factor", Some(MetaValue::F32(-1.0)))],
                None,
            ),
            "phi3.rope.scaling.attn_factor is -1",
        ),
        (
            "an original context of 0",
            variant(
                "tiny-phi3",
                "phi_orig_zero",
                &[("phi3.rope.scaling.original_context_length", u(0))],
                None,
            ),
            "phi3.rope.scaling.original_context_length is 0",
        ),
        (
            "a window that is not a number in Phi-3",
            variant(
                "tiny-phi3",
                "phi_window_type",
                &[("phi3.attention.sliding_window", s("2047"))],
                None,
            ),
            "phi3.attention.sliding_window",
        ),
        (
            "no stacked QKV in Phi-3",
            variant(
                "tiny-phi3",
                "phi_no_qkv",
                &[],
                Some(("blk.1.attn_qkv.weight", None)),
            ),
            "blk.1.attn_qkv.weight",
        ),
        (
            "a feed-forward size that does not fit the stacked gate and up",
            variant(
                "tiny-phi4",
                "phi_ffn",
                &[("phi3.feed_forward_length", u(96))],
                None,
            ),
            "blk.0.ffn_up.weight has shape [256, 64], expected [192, 64]",
        ),
    ];
    for (what, path, expect) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_silica"))
            .args([
                "generate",
                "--device",
                "cpu",
                "--max-tokens",
                "2",
                "--model",
            ])
            .arg(path)
            .arg("hi")
            .output()
            .expect("the silica binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(lines.len(), 1, "{what}: {err}");
        assert!(
            lines[0].contains(expect),
            "{what}: {:?} lacks {expect:?}",
            lines[0]
        );
        assert!(!err.contains("panicked"), "{what}: {err}");
    }
}
