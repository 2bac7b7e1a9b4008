// penalty_apply.wgsl: out = the logits with each entry seen c > 0 times
// divided by penalty^c where positive, multiplied by it where not (as the
// host sampler demotes a token once per occurrence; penalty^c as c - 1
// products, the same roundings as the CPU reference); the counts go back
// to zero for the next use.

struct Params {
    vocab: u32,
    penalty: f32,
    // workgroups along x: the grid may be split over x and y
    gx: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> more: array<u32>;
@group(0) @binding(4) var<storage, read_write> counts: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * p.gx + wid.x) * 256u + lid;
    if i >= p.vocab {
        return;
    }
    let l = logits[i];
    let c = counts[i];
    if c == 0u {
        out[i] = l;
        return;
    }
    counts[i] = 0u;
    var f = p.penalty;
    for (var k = 1u; k < c; k++) {
        f *= p.penalty;
    }
    out[i] = select(l * f, l / f, l > 0.0);
}
