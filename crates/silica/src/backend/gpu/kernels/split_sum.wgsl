// split_sum.wgsl — dst = the sum of `parts` f32 arrays of n elements laid
// end to end in src (the partial products of a split K, qmatmul_coop.wgsl),
// in OUT_DT (store.wgsl).

struct Params {
    n: u32,
    parts: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

fn value_at(e: u32) -> f32 {
    var s = src[e];
    for (var j = 1u; j < p.parts; j++) {
        s += src[j * p.n + e];
    }
    return s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    write_unit(group_index(wid, nwg) * WG + lid, p.n);
}
