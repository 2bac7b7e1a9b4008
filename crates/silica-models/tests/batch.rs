//! `Llama::forward_batch` (several sequences in one pass, each over its
//! own KV cache) against each sequence run alone through `Llama::forward`,
//! on the CPU and every GPU adapter: a prompt step with sequences of
//! different lengths and cache fills, then decode steps where sequences join
//! and leave, as a server's continuous batching drives it.

#[path = "common/tiny_llama.rs"]
mod tiny_llama;

use silica_models::llama::{Llama, SeqStep};
use tiny_llama::{Tiny, TinyModelFile};

fn rows(t: &silica::Tensor) -> Vec<Vec<f32>> {
    let v = t.shape()[1];
    t.to_vec::<f32>()
        .unwrap()
        .chunks(v)
        .map(<[f32]>::to_vec)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The last-position logits of `ids` after `prefix`, alone.
fn alone(model: &Llama, prefix: &[u32], ids: &[u32]) -> Vec<f32> {
    let mut cache = model.new_cache();
    if !prefix.is_empty() {
        model.forward(prefix, &mut cache, true).unwrap();
    }
    model
        .forward(ids, &mut cache, true)
        .unwrap()
        .to_vec()
        .unwrap()
}

#[test]
fn batched_sequences_match_each_alone() {
    let file = TinyModelFile::write_quantized("batch", &Tiny::quantized());
    for dev in tiny_llama::devices() {
        let gguf = silica_models::gguf::GgufFile::open(&file.path).unwrap();
        let model = Llama::load(&gguf, &dev, silica::DType::F32).unwrap();
        let prompts: [&[u32]; 3] = [
            &[1, 5, 9, 13, 2, 7],
            &[1, 4],
            &[1, 8, 8, 3, 30, 31, 32, 12, 6],
        ];
        let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect();
        // the third sequence has positions cached already
        model.forward(&[1, 2, 3], &mut caches[2], false).unwrap();
        let mut steps: Vec<SeqStep> = prompts
            .iter()
            .zip(caches.iter_mut())
            .map(|(ids, cache)| SeqStep { ids, cache })
            .collect();
        let batched = rows(&model.forward_batch(&mut steps).unwrap());
        let prefixes: [&[u32]; 3] = [&[], &[], &[1, 2, 3]];
        for i in 0..3 {
            let want = alone(&model, prefixes[i], prompts[i]);
            let d = max_diff(&batched[i], &want);
            assert!(d < 2e-3, "{dev:?}: sequence {i} differs by {d}");
        }
        assert_eq!(
            caches.iter().map(|c| c.len()).collect::<Vec<_>>(),
            vec![6, 2, 12]
        );

        // decode steps: sequence 1 leaves, then sequence 0 and 2 go on
        let mut steps = vec![SeqStep {
            ids: &[40],
            cache: &mut caches[0],
        }];
        let out = rows(&model.forward_batch(&mut steps).unwrap());
        let want = alone(&model, &[1, 5, 9, 13, 2, 7], &[40]);
        assert!(
            max_diff(&out[0], &want) < 2e-3,
            "{dev:?}: a one-sequence step"
        );
        let (a, b) = caches.split_at_mut(2);
        let mut steps = vec![
            SeqStep {
                ids: &[41],
                cache: &mut a[0],
            },
            SeqStep {
                ids: &[42],
                cache: &mut b[0],
            },
        ];
        let out = rows(&model.forward_batch(&mut steps).unwrap());
        let want0 = alone(&model, &[1, 5, 9, 13, 2, 7, 40], &[41]);
        let want2 = alone(&model, &[1, 2, 3, 1, 8, 8, 3, 30, 31, 32, 12, 6], &[42]);
        assert!(
            max_diff(&out[0], &want0) < 2e-3,
            "{dev:?}: decode of sequence 0"
        );
        assert!(
            max_diff(&out[1], &want2) < 2e-3,
            "{dev:?}: decode of sequence 2"
        );

        // bad input leaves every cache as it was
        let before: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let (a, b) = caches.split_at_mut(1);
        let mut steps = vec![
            SeqStep {
                ids: &[3],
                cache: &mut a[0],
            },
            SeqStep {
                ids: &[u32::MAX],
                cache: &mut b[0],
            },
        ];
        let e = model.forward_batch(&mut steps).unwrap_err().to_string();
        assert!(e.contains("vocabulary"), "{e}");
        let mut steps = vec![SeqStep {
            ids: &[],
            cache: &mut caches[0],
        }];
        assert!(model.forward_batch(&mut steps).is_err());
        assert!(model.forward_batch(&mut []).is_err());
        assert_eq!(caches.iter().map(|c| c.len()).collect::<Vec<_>>(), before);
    }
}
