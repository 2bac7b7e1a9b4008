// qrows.wgsl — rows of a quantized matrix, decoded: dst[j] = w[ids[j]]
// (an embedding lookup from a quantized table), or with `identity` set
// dst[j] = w[j] (a whole matrix decoded, ids unread). One thread decodes one part
// (8 values) of one group of one row; an id outside the table yields zeros,
// as index_select does (a kernel cannot report an error).

struct QRowParams {
    n_ids: u32,
    // values per row
    k: u32,
    row_bytes: u32,
    rows: u32,
    off_ids: u32,
    identity: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: QRowParams;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> src_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec2<u32>>;

override OUT_DT: u32 = 0u;
// f16 outputs packed by the hardware conversion (pack2x16float), on
// adapters where it rounds to nearest even as f32_to_f16 does (those with
// cooperative matrices); the integer conversion elsewhere.
override HW_PACK: bool = false;

fn pair16(lo: f32, hi: f32) -> u32 {
    if HW_PACK && OUT_DT == 1u {
        return pack2x16float(vec2<f32>(lo, hi));
    }
    return encode_pair(lo, hi, OUT_DT);
}

// Four values from element e (a multiple of 4) on, in 8-byte stores.
fn put4(e: u32, v: vec4<f32>) {
    if OUT_DT == 0u {
        dst[e >> 1u] = bitcast<vec2<u32>>(v.xy);
        dst[(e >> 1u) + 1u] = bitcast<vec2<u32>>(v.zw);
    } else {
        dst[e >> 2u] = vec2<u32>(pair16(v.x, v.y), pair16(v.z, v.w));
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
    var row = j;
    if p.identity == 0u {
        row = ids[p.off_ids + j];
    }
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
