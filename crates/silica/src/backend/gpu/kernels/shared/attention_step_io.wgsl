// attention_step_io.wgsl — decode_attention.wgsl's bindings for one decode
// step over a KV cache (STEP). src_q is the step's packed projection
// [query heads, key heads, value heads] x D, not yet rotated; the cache
// [capacity, 2 KVH, D] holds the keys and values of the earlier positions
// and gets the new position's from this kernel (keys rotated); cos_t and
// sin_t hold the rotary angles of the new position. The attention
// parameters describe q as the query heads of src_q and k, v as the views
// of the cache up to and including the new position; the mask's fields,
// unused here, carry the rest: off_m is the element of src_q where the
// new keys start, sm.x where the new values start (heads sq.z apart),
// sm.y and sm.z the elements of cos_t and sin_t where the position's
// angles start. Rows are contiguous, head sizes a multiple of 8 and
// offsets even, so every load and store below is of whole words.

@group(0) @binding(1) var<storage, read> src_q: array<u32>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;
@group(0) @binding(4) var<storage, read_write> cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<u32>;

// pairs (2i, 2i + 1) when set, (i, i + D / 2) otherwise
override ADJACENT: bool = false;

const STEP: bool = true;

// Word `i` of src_q (Q) or of the cache (K, V).
fn word(which: u32, i: u32) -> u32 {
    if which == 0u {
        return src_q[i];
    }
    return cache[i];
}

// v in DT's precision, as the separate rope kernel's output would hold it.
fn round4(v: vec4<f32>) -> vec4<f32> {
    if DT == 0u {
        return v;
    }
    let a = encode_pair(v.x, v.y, DT);
    let b = encode_pair(v.z, v.w, DT);
    return vec4<f32>(decode(a, 0u, DT), decode(a, 1u, DT), decode(b, 0u, DT), decode(b, 1u, DT));
}

// Dimensions 4c..4c+3 of the head that starts at element `head` of src_q,
// rotated by the new position's angles.
fn rotated4(head: u32, c: u32) -> vec4<f32> {
    let x = ld4(Q, head + 4u * c, 4u, 1u);
    let cs = p.sm.y;
    let sn = p.sm.z;
    if ADJACENT {
        let i = 2u * c;
        let c0 = cos_t[cs + i];
        let c1 = cos_t[cs + i + 1u];
        let s0 = sin_t[sn + i];
        let s1 = sin_t[sn + i + 1u];
        return round4(vec4<f32>(x.x * c0 - x.y * s0, x.y * c0 + x.x * s0, x.z * c1 - x.w * s1, x.w * c1 + x.z * s1));
    }
    // D / 2 is a multiple of 4: the four dimensions sit in one half
    let half = p.d / 2u;
    let e = 4u * c;
    let first = e < half;
    let i = select(e - half, e, first);
    let y = ld4(Q, head + select(e - half, e + half, first), 4u, 1u);
    let co = vec4<f32>(cos_t[cs + i], cos_t[cs + i + 1u], cos_t[cs + i + 2u], cos_t[cs + i + 3u]);
    let si = vec4<f32>(sin_t[sn + i], sin_t[sn + i + 1u], sin_t[sn + i + 2u], sin_t[sn + i + 3u]);
    return round4(select(y * si + x * co, x * co - y * si, first));
}

// Chunk c of the query head that starts at element `head` of src_q.
fn step_q4(head: u32, c: u32) -> vec4<f32> {
    return rotated4(head, c);
}

// Chunk c of the new position's key of KV head `kvh`, rotated.
fn step_k4(kvh: u32, c: u32) -> vec4<f32> {
    return rotated4(p.off_m + kvh * p.sq.z, c);
}

// Chunk c of the new position's value of KV head `kvh`.
fn step_v4(kvh: u32, c: u32) -> vec4<f32> {
    return ld4(Q, p.sm.x + kvh * p.sq.z + 4u * c, 4u, 1u);
}

// Writes v to elements e..e+3 of the cache (e even).
fn step_store(e: u32, v: vec4<f32>) {
    if DT == 0u {
        cache[e] = bitcast<u32>(v.x);
        cache[e + 1u] = bitcast<u32>(v.y);
        cache[e + 2u] = bitcast<u32>(v.z);
        cache[e + 3u] = bitcast<u32>(v.w);
    } else {
        cache[e >> 1u] = encode_pair(v.x, v.y, DT);
        cache[(e >> 1u) + 1u] = encode_pair(v.z, v.w, DT);
    }
}
