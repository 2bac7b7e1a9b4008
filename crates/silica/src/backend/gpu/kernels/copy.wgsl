// copy.wgsl — a contiguous copy of a strided view, bitwise; with INT_CAST
// 1 it widens u32 to i64, with 2 it keeps the low word of i64 (u32 output).
// Plain copies may start `dst_word` words into the output buffer (an
// in-place write into part of a larger tensor, as a KV cache append does).

struct Params {
    n: u32,
    rank: u32,
    offset: u32,
    dst_word: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

override INT_CAST: u32 = 0u;

fn src_elem(e: u32) -> u32 {
    return p.offset + strided_offset(e, p.rank, p.shape, p.strides);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let u = group_index(wid, nwg) * WG + lid;
    if INT_CAST == 1u {
        if u < p.n {
            dst[2u * u] = src[src_elem(u)];
            dst[2u * u + 1u] = 0u;
        }
    } else if INT_CAST == 2u {
        if u < p.n {
            dst[u] = src[2u * src_elem(u)];
        }
    } else {
        move_unit_at(u, p.n, p.dst_word);
    }
}
