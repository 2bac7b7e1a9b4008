//! What the decoder tests share: the golden SmolLM2 file (Hugging Face's
//! output) and greedy decoding step by step with the logits of every step.

use serde_json::Value;
use silica_models::llama::Llama;
use silica_models::sampling::argmax;

/// tests/golden/smollm2.json.
pub fn golden() -> Value {
    serde_json::from_str(include_str!("../golden/smollm2.json")).expect("golden file parses")
}

/// A JSON list of token ids.
pub fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Logits of every step of a greedy continuation of `ids`: the step that
/// chooses token i sees the prompt and tokens 0..i of `forced` when given,
/// else the model's own greedy choices. Returns the tokens and the logits.
pub fn greedy(
    model: &Llama,
    ids: &[u32],
    n: usize,
    forced: Option<&[u32]>,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut cache = model.new_cache();
    let mut l: Vec<f32> = model
        .forward(ids, &mut cache, true)
        .unwrap()
        .to_vec()
        .unwrap();
    let mut out = Vec::new();
    let mut logits = Vec::new();
    while out.len() < n {
        let next = forced.map_or_else(|| argmax(&l), |f| f[out.len()]);
        out.push(argmax(&l));
        logits.push(std::mem::take(&mut l));
        l = model
            .forward(&[next], &mut cache, true)
            .unwrap()
            .to_vec()
            .unwrap();
    }
    (out, logits)
}
