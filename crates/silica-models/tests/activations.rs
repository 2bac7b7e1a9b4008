//! Activation capture against transformers' `output_hidden_states`
//! (scripts/reference_activations.py, tests/golden/activations.json):
//! SmolLM2-135M-Instruct and all-MiniLM-L6-v2, last-token and mean pooling,
//! a padded batch of three prompts, on the CPU and every GPU adapter; and
//! the capture's own consistency (a padded batch against one sequence at a
//! time through the KV-cache forward, every-token pooling, bad requests).

use serde_json::Value;
use silica::{DType, Device, Tensor};
use silica_models::bert::Bert;
use silica_models::capture::{CaptureSpec, Pool, Site};
use silica_models::llama::Llama;
use silica_models::resolve::{resolve_decoder, resolve_encoder};

fn golden() -> Value {
    serde_json::from_str(include_str!("golden/activations.json")).expect("golden file parses")
}

/// The CPU and every GPU adapter, with the exact (f32-activation) products.
fn devices() -> Vec<Device> {
    silica::set_cpu_int8_activations(false);
    let mut out = vec![Device::cpu()];
    let n = silica::adapters().len();
    if n == 0 {
        assert!(
            std::env::var("SILICA_REQUIRE_GPU").as_deref() != Ok("1"),
            "SILICA_REQUIRE_GPU=1 but no GPU adapter"
        );
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

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    let d = t.shape()[1];
    t.to_vec::<f32>()
        .unwrap()
        .chunks(d)
        .map(<[f32]>::to_vec)
        .collect()
}

/// The largest difference relative to the reference vector's largest entry.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
        / scale
}

/// Captures the golden prompts with `capture` and compares every layer and
/// both poolings with the golden states.
fn check_golden(
    name: &str,
    g: &Value,
    tol: f32,
    capture: impl Fn(&[&[u32]], &CaptureSpec) -> Vec<Tensor>,
) {
    let layers: Vec<usize> = g["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_u64().unwrap() as usize)
        .collect();
    let prompts = g["prompts"].as_array().unwrap();
    let seqs: Vec<Vec<u32>> = prompts.iter().map(|p| ids(&p["ids"])).collect();
    let batch: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
    for pool in [Pool::Last, Pool::Mean] {
        let got = capture(&batch, &CaptureSpec::residual(&layers, pool));
        assert_eq!(got.len(), layers.len());
        for (layer, t) in layers.iter().zip(&got) {
            assert_eq!(t.shape()[0], prompts.len());
            for (p, row) in prompts.iter().zip(rows(t)) {
                let want = floats(&p[pool.name()][layer.to_string()]);
                let e = rel_err(&row, &want);
                assert!(
                    e < tol,
                    "{name}: layer {layer} {} pooling of {:?}: relative error {e}",
                    pool.name(),
                    p["text"]
                );
            }
        }
    }
}

#[test]
fn decoder_states_match_transformers() {
    let g = golden();
    let path = resolve_decoder(None).expect("the default decoder");
    for dev in devices() {
        let model = Llama::from_path(&path, &dev, DType::F32).unwrap();
        let name = format!("SmolLM2 on {dev:?}");
        check_golden(&name, &g["smollm2"], 2e-3, |b, s| {
            model.capture(b, s).unwrap()
        });

        // the padded batch against each sequence alone through the
        // KV-cache forward, every token, attention and MLP outputs too
        let seqs: Vec<Vec<u32>> = g["smollm2"]["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| ids(&p["ids"]))
            .collect();
        let batch: Vec<&[u32]> = seqs.iter().map(Vec::as_slice).collect();
        let spec = CaptureSpec {
            points: vec![(2, Site::Attention), (2, Site::Mlp), (3, Site::Residual)],
            pool: Pool::All,
        };
        let together = model.capture(&batch, &spec).unwrap();
        let total: usize = seqs.iter().map(Vec::len).sum();
        for t in &together {
            assert_eq!(t.shape(), &[total, model.config.d_model]);
        }
        let mut start = 0;
        for s in &batch {
            let alone = model.capture(&[s], &spec).unwrap();
            for (a, t) in alone.iter().zip(&together) {
                let part = t.narrow(0, start, s.len()).unwrap().contiguous().unwrap();
                let e = rel_err(&part.to_vec::<f32>().unwrap(), &a.to_vec::<f32>().unwrap());
                assert!(
                    e < 1e-4,
                    "{name}: batched and single captures differ by {e}"
                );
            }
            start += s.len();
        }
        // the last layer's residual is the one the logits are computed from
        let spec = CaptureSpec::residual(&[model.config.n_layers], Pool::Last);
        assert_eq!(model.capture(&batch, &spec).unwrap()[0].shape(), &[3, 576]);
    }
}

#[test]
fn encoder_states_match_transformers() {
    let g = golden();
    let dir = resolve_encoder(None).expect("the default encoder");
    for dev in devices() {
        let model = Bert::load(&dir, &dev, DType::F32).unwrap();
        let name = format!("MiniLM on {dev:?}");
        check_golden(&name, &g["minilm"], 1e-3, |b, s| {
            model.capture(b, s).unwrap()
        });
    }
}

#[test]
fn bad_capture_requests_are_errors() {
    let path = resolve_decoder(None).expect("the default decoder");
    let model = Llama::from_path(&path, &Device::cpu(), DType::F32).unwrap();
    let n = model.config.n_layers;
    let ok: &[u32] = &[1, 2, 3];
    let err =
        |batch: &[&[u32]], spec: &CaptureSpec| model.capture(batch, spec).unwrap_err().to_string();
    let e = err(&[ok], &CaptureSpec::residual(&[n + 1], Pool::Last));
    assert!(e.contains("out of range"), "{e}");
    let e = err(&[ok, &[]], &CaptureSpec::residual(&[1], Pool::Last));
    assert!(e.contains("sequence 1") && e.contains("empty"), "{e}");
    let e = err(&[&[u32::MAX]], &CaptureSpec::residual(&[1], Pool::Mean));
    assert!(e.contains("vocabulary"), "{e}");
    let spec = CaptureSpec {
        points: vec![(0, Site::Mlp)],
        pool: Pool::Last,
    };
    assert!(err(&[ok], &spec).contains("embedding"));
    assert!(err(&[], &CaptureSpec::residual(&[1], Pool::Last)).contains("empty"));
}
