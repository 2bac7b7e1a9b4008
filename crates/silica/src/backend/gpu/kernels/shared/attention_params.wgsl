// attention_params.wgsl — the parameters every attention kernel reads.
// q, k, v, mask are rank-4 views: q [B, Tq, H, D], k and v [B, Tk, KVH, D],
// mask [B, H, Tq, Tk]; `off_*` are their offsets and `s*` their strides in
// elements.

struct Params {
    batch: u32,
    tq: u32,
    tk: u32,
    heads: u32,
    kv_heads: u32,
    d: u32,
    scale: f32,
    causal: u32,
    off_q: u32,
    off_k: u32,
    off_v: u32,
    off_m: u32,
    sq: vec4<u32>,
    sk: vec4<u32>,
    sv: vec4<u32>,
    sm: vec4<u32>,
    // tanh soft-capping of the scaled scores, cap · tanh(s / cap); 0: none
    softcap: f32,
    // split-K decoding: keys per workgroup, workgroups per query row, and
    // the words of one partial result in the scratch buffer
    chunk: u32,
    chunks: u32,
    record: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

override DT: u32 = 0u;
override HAS_MASK: bool = false;

const NEG_INF: f32 = -3.4028235e38;

// A scaled score soft-capped where the launcher asks for it.
fn capped(s: f32) -> f32 {
    if p.softcap > 0.0 {
        // clamped: some drivers overflow inside tanh for large |x|
        return p.softcap * tanh(clamp(s / p.softcap, -15.0, 15.0));
    }
    return s;
}
