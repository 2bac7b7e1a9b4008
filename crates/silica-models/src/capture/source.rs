//! The model a capture reads from, and how prompts are batched for it.

use silica::Tensor;

use super::CaptureSpec;
use crate::Result;
use crate::bert::SentenceEncoder;
use crate::llama::Llama;
use crate::tokenizer::Tokenizer;

/// Tokens (batch size times the longest prompt) in one forward pass at
/// most: enough to keep a GPU busy, little enough for a small one's memory.
pub const TOKENS_PER_BATCH: usize = 8192;

/// A loaded model activations are captured from: a decoder with its
/// tokenizer, or a sentence encoder.
#[derive(Clone, Copy)]
pub enum Source<'a> {
    Decoder(&'a Llama, &'a Tokenizer),
    Encoder(&'a SentenceEncoder),
}

impl Source<'_> {
    /// Transformer blocks (layers run from 0, the embeddings, to this).
    pub fn n_layers(&self) -> usize {
        match self {
            Source::Decoder(m, _) => m.config.n_layers,
            Source::Encoder(e) => e.model().config().num_hidden_layers,
        }
    }

    /// The width of a captured row.
    pub fn d_model(&self) -> usize {
        match self {
            Source::Decoder(m, _) => m.config.d_model,
            Source::Encoder(e) => e.model().config().hidden_size,
        }
    }

    /// The architecture as activation and probe files name it (`bert` for
    /// encoders).
    pub fn architecture(&self) -> String {
        match self {
            Source::Decoder(m, _) => m.config.architecture.clone(),
            Source::Encoder(_) => "bert".into(),
        }
    }

    /// The most tokens a prompt may have.
    pub fn max_tokens(&self) -> usize {
        match self {
            Source::Decoder(m, _) => m.config.context_length,
            Source::Encoder(e) => e.max_seq_length(),
        }
    }

    /// The prompt's token ids as the model sees them (BOS where the
    /// decoder wants it; the encoder's special tokens and truncation).
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            Source::Decoder(_, t) => t.encode(text, true),
            Source::Encoder(e) => e.tokenize(text),
        }
    }

    /// The states `spec` names for a batch of token sequences.
    pub fn capture(&self, batch: &[&[u32]], spec: &CaptureSpec) -> Result<Vec<Tensor>> {
        match self {
            Source::Decoder(m, _) => m.capture(batch, spec),
            Source::Encoder(e) => e.model().capture(batch, spec),
        }
    }
}

/// Batches of prompt indices for prompts of `lens` tokens: sorted by
/// length within windows of 64 batches (little padding, and the output
/// order stays close to the input's), each at most `batch_size` prompts
/// and [`TOKENS_PER_BATCH`] padded tokens (a longer prompt goes alone).
pub fn batches(lens: &[usize], batch_size: usize) -> Vec<Vec<usize>> {
    let batch_size = batch_size.max(1);
    let mut out = Vec::new();
    let order: Vec<usize> = (0..lens.len()).collect();
    for chunk in order.chunks(batch_size * 64) {
        let mut chunk = chunk.to_vec();
        chunk.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
        let mut cur: Vec<usize> = Vec::new();
        for i in chunk {
            // sorted longest first: the batch's first prompt is its longest
            let longest = cur.first().map_or(lens[i], |&f| lens[f]);
            if !cur.is_empty()
                && (cur.len() == batch_size || (cur.len() + 1) * longest > TOKENS_PER_BATCH)
            {
                out.push(std::mem::take(&mut cur));
            }
            cur.push(i);
        }
        if !cur.is_empty() {
            out.push(cur);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_every_prompt_once() {
        let lens: Vec<usize> = (0..100).map(|i| 1 + (i * 37) % 90).collect();
        let plan = batches(&lens, 8);
        let mut seen: Vec<usize> = plan.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        assert!(plan.iter().all(|b| b.len() <= 8));
        // a long prompt gets a batch of its own when 2 would pass the budget
        let plan = batches(&[TOKENS_PER_BATCH, 3, 4], 8);
        assert_eq!(plan[0], vec![0]);
        assert_eq!(plan[1], vec![2, 1]);
    }
}
