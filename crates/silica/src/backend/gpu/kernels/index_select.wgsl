// index_select.wgsl — out[.., j, ..] = src[.., idx[j], ..] along AXIS,
// bitwise. Indices are u32 or i64 (IDX_DT 3 or 4); an index outside the
// dimension yields zeros (a kernel cannot report an error).

struct Params {
    n: u32,
    rank: u32,
    offset: u32,
    axis: u32,
    idx_offset: u32,
    idx_stride: u32,
    axis_size: u32,
    _pad: u32,
    // the output's shape; the source's strides
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override IDX_DT: u32 = 3u;

fn index_at(j: u32) -> u32 {
    let k = p.idx_offset + j * p.idx_stride;
    if IDX_DT == 4u {
        if idx[2u * k + 1u] != 0u {
            return NONE; // negative or at least 2^32
        }
        return idx[2u * k];
    }
    return idx[k];
}

fn src_elem(e: u32) -> u32 {
    var shape = p.shape;
    var strides = p.strides;
    var rem = e;
    var off = p.offset;
    for (var i = 0u; i < p.rank; i++) {
        let d = p.rank - 1u - i;
        let n = shape[d >> 2u][d & 3u];
        var c = rem % n;
        rem /= n;
        if d == p.axis {
            c = index_at(c);
            if c >= p.axis_size {
                return NONE;
            }
        }
        off += c * strides[d >> 2u][d & 3u];
    }
    return off;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    move_unit(group_index(wid, nwg) * WG + lid, p.n);
}
