// penalty_count.wgsl: counts[id] += 1 for each token id of `ids` and
// `more` (the tokens a repetition penalty demotes: those the host knows,
// and the one picked on the device and not read back yet); ids at or past
// the vocabulary count nowhere.

struct Params {
    n: u32,
    more: u32,
    vocab: u32,
    // workgroups along x: the grid may be split over x and y
    gx: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> more: array<u32>;
@group(0) @binding(4) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * p.gx + wid.x) * 256u + lid;
    var id = 0xffffffffu;
    if i < p.n {
        id = ids[i];
    } else if i < p.n + p.more {
        id = more[i - p.n];
    }
    if id < p.vocab {
        atomicAdd(&counts[id], 1u);
    }
}
