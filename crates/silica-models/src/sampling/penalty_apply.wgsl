// penalty_apply.wgsl: out = the logits, each entry seen c > 0 times by its
// row demoted as the host sampler demotes it: divided by repetition^c
// where positive, multiplied by it where not (repetition^c as c - 1
// products, the same roundings as the CPU reference), then less
// c * frequency + presence; the counts go back to zero for the next use.

struct Params {
    total: u32,
    vocab: u32,
    // workgroups along x: the grid may be split over x and y
    gx: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> pairs: array<u32>;
@group(0) @binding(3) var<storage, read> picks: array<u32>;
@group(0) @binding(4) var<storage, read> flight: array<u32>;
// per row: repetition, frequency, presence
@group(0) @binding(5) var<storage, read> pens: array<f32>;
@group(0) @binding(6) var<storage, read_write> counts: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * p.gx + wid.x) * 256u + lid;
    if i >= p.total {
        return;
    }
    let l = logits[i];
    let c = counts[i];
    if c == 0u {
        out[i] = l;
        return;
    }
    counts[i] = 0u;
    let r = 3u * (i / p.vocab);
    let rep = pens[r];
    var f = rep;
    for (var k = 1u; k < c; k++) {
        f *= rep;
    }
    let demoted = select(l * f, l / f, l > 0.0);
    out[i] = demoted - (f32(c) * pens[r + 1u] + pens[r + 2u]);
}
