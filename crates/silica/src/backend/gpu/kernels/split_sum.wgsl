// split_sum.wgsl — dst = the sum of `parts` f32 arrays of n elements laid
// end to end in src (the partial products of a split K, qmatmul_coop.wgsl),
// in OUT_DT (store.wgsl). With a pitch, each part is a matrix of `cols`
// columns whose rows start `pitch` apart and whose row count is padded to
// a multiple of 16 (qmatmul_narrow.wgsl's fragments).

struct Params {
    n: u32,
    parts: u32,
    // columns of dst, and the row pitch of the parts (0: none)
    cols: u32,
    pitch: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

fn value_at(e: u32) -> f32 {
    var at = e;
    var stride = p.n;
    if p.pitch != 0u {
        at = e / p.cols * p.pitch + e % p.cols;
        stride = (p.n / p.cols + 15u) / 16u * 16u * p.pitch;
    }
    var s = src[at];
    for (var j = 1u; j < p.parts; j++) {
        s += src[j * stride + at];
    }
    return s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    write_unit(group_index(wid, nwg) * WG + lid, p.n);
}
