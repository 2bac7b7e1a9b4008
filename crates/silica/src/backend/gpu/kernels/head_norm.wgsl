// RMSNorm of the query and key heads of a packed QKV tensor [T, H + 2 KVH, D],
// each with its own weight [D]; the value heads are copied. One workgroup a
// row of D (one head of one position). Elements are f32 words, or two f16 a
// word where p.half is 1 (D even).

struct Params {
    rows: u32,
    heads: u32,
    q_heads: u32,
    k_heads: u32,
    d: u32,
    eps: f32,
    half: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> qw: array<u32>;
@group(0) @binding(3) var<storage, read> kw: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<u32>;

const WG: u32 = 64u;
var<workgroup> part: array<f32, 64>;

// the (one or two) values of word `w`
fn values(word: u32) -> vec2<f32> {
    if p.half == 1u {
        return unpack2x16float(word);
    }
    return vec2<f32>(bitcast<f32>(word), 0.0);
}

fn weight(is_q: bool, w: u32) -> vec2<f32> {
    if is_q {
        return values(qw[w]);
    }
    return values(kw[w]);
}

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.y * nwg.x + wid.x;
    if row >= p.rows {
        return;
    }
    let head = row % p.heads;
    let words = select(p.d, p.d / 2u, p.half == 1u);
    let base = row * words;
    if head >= p.q_heads + p.k_heads {
        for (var w = lid; w < words; w += WG) {
            y[base + w] = x[base + w];
        }
        return;
    }
    var ss = 0.0;
    for (var w = lid; w < words; w += WG) {
        let v = values(x[base + w]);
        ss += dot(v, v);
    }
    part[lid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            part[lid] += part[lid + s];
        }
        workgroupBarrier();
    }
    let scale = inverseSqrt(part[0] / f32(p.d) + p.eps);
    let is_q = head < p.q_heads;
    for (var w = lid; w < words; w += WG) {
        let v = values(x[base + w]) * scale * weight(is_q, w);
        if p.half == 1u {
            y[base + w] = pack2x16float(v);
        } else {
            y[base + w] = bitcast<u32>(v.x);
        }
    }
}
