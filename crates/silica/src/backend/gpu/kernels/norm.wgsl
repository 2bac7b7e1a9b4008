// norm.wgsl — RMSNorm (LAYER = false) or LayerNorm (LAYER = true) of each
// row of the last dimension, one workgroup per row, in f32. Rows may be
// strided views as in softmax.wgsl; weight and bias are contiguous [n];
// the output is contiguous. For 16-bit outputs n is even (the launcher goes
// through f32 otherwise), so each thread writes whole words.

struct Params {
    rows: u32,
    n: u32,
    rank: u32,
    offset: u32,
    stride: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read> weight: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<u32>;

override LAYER: bool = false;
override SRC_DT: u32 = 0u;
override OUT_DT: u32 = 0u;

fn load(i: u32) -> f32 {
    return decode(src[word_index(i, SRC_DT)], i, SRC_DT);
}

fn param(buf: u32, i: u32) -> f32 {
    if buf == 0u {
        return decode(weight[word_index(i, SRC_DT)], i, SRC_DT);
    }
    return decode(bias[word_index(i, SRC_DT)], i, SRC_DT);
}

fn normed(base: u32, k: u32, mean: f32, inv: f32) -> f32 {
    let x = load(base + k * p.stride);
    if LAYER {
        return (x - mean) * inv * param(0u, k) + param(1u, k);
    }
    return x * inv * param(0u, k);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let base = p.offset + strided_offset(row, p.rank, p.shape, p.strides);
    let nf = f32(p.n);
    var mean = 0.0;
    if LAYER {
        var s = 0.0;
        for (var k = lid; k < p.n; k += WG) {
            s += load(base + k * p.stride);
        }
        mean = workgroup_sum(s, lid) / nf;
    }
    var sq = 0.0;
    for (var k = lid; k < p.n; k += WG) {
        let x = load(base + k * p.stride) - mean;
        sq += x * x;
    }
    let inv = inverseSqrt(workgroup_sum(sq, lid) / nf + p.eps);
    if OUT_DT == 1u || OUT_DT == 2u {
        for (var j = lid; j < p.n / 2u; j += WG) {
            let y0 = normed(base, 2u * j, mean, inv);
            let y1 = normed(base, 2u * j + 1u, mean, inv);
            dst[row * (p.n / 2u) + j] = encode_pair(y0, y1, OUT_DT);
        }
    } else {
        for (var k = lid; k < p.n; k += WG) {
            dst[row * p.n + k] = bitcast<u32>(normed(base, k, mean, inv));
        }
    }
}
