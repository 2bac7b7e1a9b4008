// gumbel.wgsl: out = l * inv_t + g for the rows that draw (inv_t > 0), the
// lowest f32 for their entries below the row's cut, out = l for the other
// rows; g = -log(-log(u)), u from a hash of the row's key, counter and the
// entry's index (sampling/device.rs has the same hash).

struct Params {
    n: u32,
    vocab: u32,
    // workgroups along x: the grid may be split over x and y
    gx: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
// per row: key low, key high, counter, inv_t; top-k, top-p, min-p, 0
@group(0) @binding(2) var<storage, read> rows: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> cuts: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

fn mix(a: u32) -> u32 {
    var x = a;
    x ^= x >> 16u;
    x *= 0x7feb352du;
    x ^= x >> 15u;
    x *= 0x846ca68bu;
    return x ^ (x >> 16u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let at = (wid.y * p.gx + wid.x) * 256u + lid;
    if at >= p.n {
        return;
    }
    let row = at / p.vocab;
    let i = at % p.vocab;
    let w = rows[2u * row];
    let inv_t = bitcast<f32>(w.w);
    let l = logits[at];
    if inv_t == 0.0 {
        out[at] = l;
        return;
    }
    let s = l * inv_t;
    if !(s >= cuts[row]) {
        out[at] = -3.40282347e38;
        return;
    }
    let h = mix(i ^ mix(w.z ^ mix(w.x ^ mix(w.y))));
    // 23 bits: exact in f32, so u < 1 (sampling/device.rs, `unit`)
    let u = (f32(h >> 9u) + 0.5) / 8388608.0;
    out[at] = s - log(-log(u));
}
