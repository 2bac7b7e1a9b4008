// rope.wgsl — rotary embeddings of x [.., T, H, D] with angle tables cos
// and sin [T, D/2] (f32, contiguous from element cos_off / sin_off); heads
// from `rotated` on are copied as they are. Thread `u` owns output unit `u` (see
// store.wgsl) and computes each of its elements from the element and its
// partner: (2i, 2i+1) when ADJACENT, (i, i + D/2) otherwise. Rows of x
// (its last dimension) may be strided views as in softmax.wgsl.

struct Params {
    n: u32,
    d: u32,
    heads: u32,
    positions: u32,
    rank: u32,
    offset: u32,
    stride: u32,
    cos_off: u32,
    sin_off: u32,
    // heads from this one on are copied unchanged
    rotated: u32,
    _pad1: u32,
    _pad2: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<u32>;

override ADJACENT: bool = true;
override SRC_DT: u32 = 0u;

fn load(i: u32) -> f32 {
    return decode(src[word_index(i, SRC_DT)], i, SRC_DT);
}

fn value_at(e: u32) -> f32 {
    let row = e / p.d;
    let k = e % p.d;
    let half = p.d / 2u;
    let base = p.offset + strided_offset(row, p.rank, p.shape, p.strides);
    let pos = (row / p.heads) % p.positions;
    if row % p.heads >= p.rotated {
        return load(base + k * p.stride);
    }
    var i: u32;
    var first: bool;
    var partner: u32;
    if ADJACENT {
        i = k / 2u;
        first = (k & 1u) == 0u;
        partner = k ^ 1u;
    } else {
        i = k % half;
        first = k < half;
        partner = select(k - half, k + half, first);
    }
    let c = cos_t[p.cos_off + pos * half + i];
    let s = sin_t[p.sin_off + pos * half + i];
    let x = load(base + k * p.stride);
    let y = load(base + partner * p.stride);
    if first {
        return x * c - y * s;
    }
    return y * s + x * c;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    write_unit(group_index(wid, nwg) * WG + lid, p.n);
}
