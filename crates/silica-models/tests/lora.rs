//! LoRA adapters on SmolLM2-135M-Instruct against PEFT + transformers on
//! the same dequantized weights (scripts/lora_golden.py, output and the
//! adapter in tests/golden/lora/): a rank-8 adapter on all seven
//! projections of three layers, as a PEFT folder and as llama.cpp's
//! converter writes it to GGUF, on the CPU and on every GPU adapter; scale
//! changes and several adapters at once; and the errors of adapters that
//! do not fit the base.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use safetensors::tensor::{Dtype, TensorView};
use serde_json::Value;
use silica::{DType, Device, Tensor};
use silica_models::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use silica_models::llama::{Llama, SeqStep};
use silica_models::lora::{LoraAdapter, LoraWeight};
use silica_models::resolve::resolve_decoder;

/// Largest |silica - reference| over the compared logits (f32 throughout;
/// the base alone is within 1e-3, tests/llama.rs).
const MAX_ABS_ERR: f32 = 2e-3;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/lora")
}

fn golden() -> &'static Value {
    static GOLDEN: OnceLock<Value> = OnceLock::new();
    GOLDEN.get_or_init(|| {
        let text = std::fs::read_to_string(golden_dir().join("golden.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

fn base_gguf() -> &'static GgufFile {
    static GGUF: OnceLock<GgufFile> = OnceLock::new();
    GGUF.get_or_init(|| {
        // the CPU's exact products (as tests/llama.rs): its default 8-bit
        // activations move logits by more than MAX_ABS_ERR
        silica::set_cpu_int8_activations(false);
        let path = resolve_decoder(None).expect("the default decoder resolves");
        GgufFile::open(path).unwrap()
    })
}

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
        if let Device::Gpu(g) = &dev {
            g.set_int8_activations(false);
        }
        out.push(dev);
    }
    out
}

fn ids() -> Vec<u32> {
    golden()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
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

/// Compares every position's logits (the golden slice of the vocabulary)
/// and argmax with `want` (one of the golden runs); with `greedy`, also the
/// greedy continuation through the KV cache.
fn check(model: &Llama, want: &Value, what: &str, greedy: bool) {
    let ids = ids();
    let vocab = model.config.vocab_size;
    let mut cache = model.new_cache();
    let logits: Vec<f32> = model
        .forward(&ids, &mut cache, false)
        .unwrap()
        .to_vec()
        .unwrap();
    let mut worst = 0f32;
    for (p, row_want) in want["logits"].as_array().unwrap().iter().enumerate() {
        let row = &logits[p * vocab..(p + 1) * vocab];
        for (i, w) in row_want.as_array().unwrap().iter().enumerate() {
            worst = worst.max((row[i] - w.as_f64().unwrap() as f32).abs());
        }
        assert_eq!(
            argmax(row) as u64,
            want["argmax"][p].as_u64().unwrap(),
            "{what}: argmax of position {p}"
        );
    }
    assert!(
        worst <= MAX_ABS_ERR,
        "{what}: logits differ by {worst} (limit {MAX_ABS_ERR})"
    );
    if greedy {
        let want: Vec<u32> = want["greedy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let last = ids.len() - 1;
        let mut next = argmax(&logits[last * vocab..(last + 1) * vocab]);
        let mut got = Vec::new();
        while got.len() < want.len() {
            got.push(next);
            let l: Vec<f32> = model
                .forward(&[next], &mut cache, true)
                .unwrap()
                .to_vec()
                .unwrap();
            next = argmax(&l);
        }
        assert_eq!(got, want, "{what}: greedy tokens differ");
    }
    eprintln!("{what}: logits within {worst:.2e} of the reference");
}

#[test]
fn peft_adapter_matches_peft_on_every_device() {
    let gguf = base_gguf();
    let g = golden();
    for dev in devices() {
        let mut model = Llama::load(gguf, &dev, DType::F32).unwrap();
        let adapter = LoraAdapter::open(golden_dir(), &model.config, &dev, DType::F32).unwrap();
        assert_eq!(adapter.weights().count(), 3 * 7);
        model.set_adapters(&[(&adapter, 1.0)]).unwrap();
        check(&model, &g["scale_1"], &format!("{dev} scale 1"), true);
        // a new scale without reloading; two adapters add up
        model.set_adapters(&[(&adapter, 0.5)]).unwrap();
        check(&model, &g["scale_0_5"], &format!("{dev} scale 0.5"), false);
        model
            .set_adapters(&[(&adapter, 0.25), (&adapter, 0.25)])
            .unwrap();
        check(&model, &g["scale_0_5"], &format!("{dev} 2 x 0.25"), false);
        model.set_adapters(&[]).unwrap();
        assert!(!model.has_adapters());
        check(&model, &g["base"], &format!("{dev} no adapter"), false);
    }
}

/// The prompt in two steps (the second through the cache) and the batched
/// forward pass of two sequences go through the same block, adapters
/// included, and give the one-step logits.
#[test]
fn cached_and_batched_steps_see_the_adapter() {
    let dev = Device::cpu();
    let mut model = Llama::load(base_gguf(), &dev, DType::F32).unwrap();
    let adapter = LoraAdapter::open(golden_dir(), &model.config, &dev, DType::F32).unwrap();
    model.set_adapters(&[(&adapter, 1.0)]).unwrap();
    let ids = ids();
    let want: Vec<f32> = model
        .forward(&ids, &mut model.new_cache(), true)
        .unwrap()
        .to_vec()
        .unwrap();
    let worst = |got: &[f32]| {
        want.iter()
            .zip(got)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    };
    let mut cache = model.new_cache();
    model.forward(&ids[..3], &mut cache, true).unwrap();
    let got: Vec<f32> = model
        .forward(&ids[3..], &mut cache, true)
        .unwrap()
        .to_vec()
        .unwrap();
    assert!(
        worst(&got) < 1e-3,
        "prefill in two steps differs by {}",
        worst(&got)
    );
    let (mut c1, mut c2) = (model.new_cache(), model.new_cache());
    let mut steps = [
        SeqStep {
            ids: &ids[..2],
            cache: &mut c1,
        },
        SeqStep {
            ids: &ids,
            cache: &mut c2,
        },
    ];
    let last: Vec<f32> = model.forward_batch(&mut steps).unwrap().to_vec().unwrap();
    let vocab = model.config.vocab_size;
    assert_eq!(last.len(), 2 * vocab);
    let got = &last[vocab..];
    assert!(worst(got) < 1e-3, "batched step differs by {}", worst(got));
}

/// llama.cpp's convert_lora_to_gguf.py permuted B's query and key rows as
/// its converter permutes the base's; the PEFT reader must give the same
/// tensors, and the GGUF adapter the same logits.
#[test]
fn llama_cpp_gguf_adapter_equals_the_peft_one() {
    let dev = Device::cpu();
    let mut model = Llama::load(base_gguf(), &dev, DType::F32).unwrap();
    let peft = LoraAdapter::open(golden_dir(), &model.config, &dev, DType::F32).unwrap();
    let path = golden_dir().join("adapter.gguf");
    let gguf = LoraAdapter::open(&path, &model.config, &dev, DType::F32).unwrap();
    assert_eq!(gguf.weights().count(), peft.weights().count());
    for (name, p) in peft.weights() {
        let q = gguf
            .get(name)
            .unwrap_or_else(|| panic!("{name} in the GGUF"));
        // f16 values in both files: exactly equal
        assert_eq!(
            p.a.to_vec::<f32>().unwrap(),
            q.a.to_vec::<f32>().unwrap(),
            "{name} A"
        );
        assert_eq!(
            p.b.to_vec::<f32>().unwrap(),
            q.b.to_vec::<f32>().unwrap(),
            "{name} B"
        );
        assert_eq!(p.scale, q.scale, "{name} scale");
    }
    model.set_adapters(&[(&gguf, 1.0)]).unwrap();
    check(
        &model,
        &golden()["scale_1"],
        "llama.cpp GGUF adapter",
        false,
    );
}

/// A GGUF adapter written with silica's own writer reads back the same.
#[test]
fn gguf_adapter_written_by_silica_reads_back() {
    let dev = Device::cpu();
    let config = silica_models::llama::LlamaConfig::from_gguf(base_gguf()).unwrap();
    let peft = LoraAdapter::open(golden_dir(), &config, &dev, DType::F32).unwrap();
    let mut w = GgufWriter::new();
    let meta = [
        ("general.architecture", MetaValue::String("llama".into())),
        ("general.type", MetaValue::String("adapter".into())),
        ("adapter.type", MetaValue::String("lora".into())),
        ("adapter.lora.alpha", MetaValue::F32(16.0)),
    ];
    for (k, v) in meta {
        w.metadata(k, v).unwrap();
    }
    let bytes = |t: &Tensor| -> Vec<u8> {
        t.to_vec::<f32>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    };
    for (name, lw) in peft.weights() {
        let a = format!("{name}.lora_a");
        let b = format!("{name}.lora_b");
        w.add_tensor(a, lw.a.shape(), GgmlType::F32, bytes(&lw.a))
            .unwrap();
        w.add_tensor(b, lw.b.shape(), GgmlType::F32, bytes(&lw.b))
            .unwrap();
    }
    let path = scratch("written.gguf");
    w.write_to_path(&path).unwrap();
    let back = LoraAdapter::open(&path, &config, &dev, DType::F32).unwrap();
    for (name, p) in peft.weights() {
        let q = back.get(name).unwrap();
        assert_eq!(p.b.to_vec::<f32>().unwrap(), q.b.to_vec::<f32>().unwrap());
        assert_eq!(p.scale, q.scale);
    }
    std::fs::remove_file(path).ok();
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("silica-lora-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Names and shapes of tensors to write.
type Tensors = Vec<(String, Vec<usize>)>;

/// Writes a PEFT folder `dir` holding `tensors` (f32) and `config`.
fn write_peft(dir: &Path, config: &str, tensors: &[(String, Vec<usize>)]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("adapter_config.json"), config).unwrap();
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s)| {
            let len: usize = s.iter().product();
            let bytes = (0..len)
                .flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes())
                .collect();
            (n.clone(), s.clone(), bytes)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), d).unwrap(),
            )
        })
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("adapter_model.safetensors"), bytes).unwrap();
}

#[test]
fn rslora_prefixes_and_paths() {
    let dev = Device::cpu();
    let config = silica_models::llama::LlamaConfig::from_gguf(base_gguf()).unwrap();
    let q = |p: &str| format!("{p}layers.2.self_attn.q_proj");
    // no `base_model.model.` prefix, rsLoRA: alpha / sqrt(r)
    let dir = scratch("rslora");
    let tensors = [
        (format!("{}.lora_A.weight", q("model.")), vec![4, 576]),
        (format!("{}.lora_B.weight", q("model.")), vec![576, 4]),
    ];
    write_peft(
        &dir,
        r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": true}"#,
        &tensors,
    );
    // the safetensors file's path finds the config beside it
    let a = LoraAdapter::open(
        dir.join("adapter_model.safetensors"),
        &config,
        &dev,
        DType::F32,
    )
    .unwrap();
    let w: &LoraWeight = a.get("blk.2.attn_q.weight").unwrap();
    assert_eq!(w.scale, 4.0);
    assert_eq!(w.rank(), 4);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn adapters_that_do_not_fit_are_errors_naming_the_tensor() {
    let dev = Device::cpu();
    let config = silica_models::llama::LlamaConfig::from_gguf(base_gguf()).unwrap();
    let cfg = r#"{"peft_type": "LORA", "r": 8, "lora_alpha": 16}"#;
    let pair = |module: &str, a: [usize; 2], b: [usize; 2]| {
        vec![
            (
                format!("base_model.model.model.{module}.lora_A.weight"),
                a.to_vec(),
            ),
            (
                format!("base_model.model.model.{module}.lora_B.weight"),
                b.to_vec(),
            ),
        ]
    };
    // (folder, config, tensors, what the error says)
    let cases: [(&str, &str, Tensors, &str); 6] = [
        (
            "other-shapes",
            cfg,
            // a 1B model's q_proj (2048 wide)
            pair("layers.0.self_attn.q_proj", [8, 2048], [2048, 8]),
            "layers.0.self_attn.q_proj.lora_A.weight",
        ),
        (
            "no-such-layer",
            cfg,
            pair("layers.40.self_attn.q_proj", [8, 576], [576, 8]),
            "layer 40",
        ),
        (
            "no-such-module",
            cfg,
            pair("layers.0.self_attn.c_attn", [8, 576], [1728, 8]),
            "c_attn",
        ),
        (
            "fused-qkv-on-llama",
            cfg,
            pair("layers.0.self_attn.qkv_proj", [8, 576], [960, 8]),
            "does not have",
        ),
        (
            "rank-0",
            r#"{"peft_type": "LORA", "r": 0, "lora_alpha": 16}"#,
            pair("layers.0.self_attn.q_proj", [8, 576], [576, 8]),
            "rank",
        ),
        (
            "rank-mismatch",
            r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 16}"#,
            pair("layers.0.self_attn.q_proj", [8, 576], [576, 8]),
            "r = 4",
        ),
    ];
    for (name, cfg, tensors, needle) in cases {
        let dir = scratch(name);
        write_peft(&dir, cfg, &tensors);
        let e = LoraAdapter::open(&dir, &config, &dev, DType::F32)
            .err()
            .unwrap_or_else(|| panic!("{name}: no error"));
        let msg = e.to_string();
        assert!(msg.contains(needle), "{name}: {msg}");
        std::fs::remove_dir_all(dir).ok();
    }
    // a model, not an adapter
    let path = resolve_decoder(None).unwrap();
    let e = LoraAdapter::open(&path, &config, &dev, DType::F32)
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a LoRA adapter"), "{e}");
    // an adapter for a model of other shapes, given to set_adapters
    let mut weights = BTreeMap::new();
    let t = |shape: &[usize]| Tensor::zeros(shape, DType::F32, &dev).unwrap();
    weights.insert(
        "blk.0.attn_q.weight".to_string(),
        LoraWeight {
            a: t(&[8, 576]),
            b: t(&[576, 8]),
            scale: 1.0,
        },
    );
    let ok = LoraAdapter::from_weights("made", weights, &config).unwrap();
    let mut other = config.clone();
    other.d_model = 960;
    let mut w2 = BTreeMap::new();
    w2.insert(
        "blk.0.attn_q.weight".to_string(),
        LoraWeight {
            a: t(&[8, 576]),
            b: t(&[576, 8]),
            scale: 1.0,
        },
    );
    let e = LoraAdapter::from_weights("made", w2, &other).err().unwrap();
    assert!(e.to_string().contains("blk.0.attn_q.weight"), "{e}");
    let mut model = Llama::load(base_gguf(), &dev, DType::F32).unwrap();
    model.set_adapters(&[(&ok, 1.0)]).unwrap();
}
