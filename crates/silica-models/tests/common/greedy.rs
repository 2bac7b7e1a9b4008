//! Greedy decoding step by step for the decoder tests, with the logits of
//! every step.

use silica_models::llama::Llama;
use silica_models::sampling::argmax;

/// Logits of every step of a greedy continuation of `ids`: the step that
/// chooses token i sees the prompt and tokens 0..i of `forced` when given,
/// else the model's own greedy choices. Returns the tokens and the logits.
pub fn run(
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
