// attention_combine.wgsl — the second pass of split-K decoding
// (decode_attention.wgsl): merges the partial results of the chunks of
// each query row, y = Σ acc_c·exp(m_c - M) / Σ l_c·exp(m_c - M) with
// M = max m_c. One workgroup of 64 threads per row; thread t writes
// dimensions 2t + 128i and 2t + 128i + 1, 16-bit pairs as one word.

struct Params {
    rows: u32,
    d: u32,
    chunks: u32,
    record: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// [rows, chunks, record]: m, l, 2 unused words, acc[D] (f32 words)
@group(0) @binding(1) var<storage, read> partials: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

override OUT_DT: u32 = 0u;

fn at(i: u32) -> f32 {
    return bitcast<f32>(partials[i]);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let base = row * p.chunks * p.record;
    var big = -3.4028235e38;
    for (var k = 0u; k < p.chunks; k++) {
        big = max(big, at(base + k * p.record));
    }
    for (var c = 2u * lid; c < p.d; c += 128u) {
        var sum = 0.0;
        var y = vec2<f32>(0.0);
        for (var k = 0u; k < p.chunks; k++) {
            let r = base + k * p.record;
            let w = exp(at(r) - big);
            sum = fma(w, at(r + 1u), sum);
            y = fma(vec2<f32>(w), vec2<f32>(at(r + 4u + c), at(r + 5u + c)), y);
        }
        // no visible key: NaN, as on the CPU (0 / 0 is not reliably NaN on GPUs)
        y = select(y / sum, vec2<f32>(bitcast<f32>(0x7fc00000u)), sum == 0.0);
        let e = row * p.d + c;
        if OUT_DT == 1u || OUT_DT == 2u {
            dst[e >> 1u] = encode_pair(y.x, y.y, OUT_DT);
        } else {
            dst[e] = bitcast<u32>(y.x);
            dst[e + 1u] = bitcast<u32>(y.y);
        }
    }
}
