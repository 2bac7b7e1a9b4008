// qrows.wgsl — rows of a quantized matrix, decoded: dst[j] = w[ids[j]]
// (an embedding lookup from a quantized table). One thread decodes one part
// (8 values) of one group of one row; an id outside the table yields zeros,
// as index_select does (a kernel cannot report an error).

struct QRowParams {
    n_ids: u32,
    // values per row
    k: u32,
    row_bytes: u32,
    rows: u32,
    off_ids: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: QRowParams;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> src_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override OUT_DT: u32 = 0u;

// Four values from element e (a multiple of 4) on.
fn put4(e: u32, v: vec4<f32>) {
    if OUT_DT == 0u {
        dst[e] = bitcast<u32>(v.x);
        dst[e + 1u] = bitcast<u32>(v.y);
        dst[e + 2u] = bitcast<u32>(v.z);
        dst[e + 3u] = bitcast<u32>(v.w);
    } else {
        dst[e >> 1u] = encode_pair(v.x, v.y, OUT_DT);
        dst[(e >> 1u) + 1u] = encode_pair(v.z, v.w, OUT_DT);
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    let parts = p.k / 8u;
    if t >= p.n_ids * parts {
        return;
    }
    let j = t / parts;
    let gi = (t % parts) / 4u;
    let q = t % 4u;
    let row = ids[p.off_ids + j];
    var v = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
    if row < p.rows {
        let at = group_at(row, gi);
        v = part_values(at.x, at.y, q, group_scale(at.x, at.y));
    }
    let ko = part_k(q);
    let e = j * p.k + gi * 32u;
    put4(e + ko.x, v[0]);
    put4(e + ko.y, v[1]);
}
