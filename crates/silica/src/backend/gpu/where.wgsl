// where.wgsl — dst = cond != 0 ? a : b elementwise over three views broadcast
// to one shape. The condition may have any dtype; a and b are floats.

struct Params {
    n: u32,
    rank: u32,
    off_c: u32,
    off_a: u32,
    off_b: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    shape: array<vec4<u32>, 2>,
    strides_c: array<vec4<u32>, 2>,
    strides_a: array<vec4<u32>, 2>,
    strides_b: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src_c: array<u32>;
@group(0) @binding(2) var<storage, read> src_a: array<u32>;
@group(0) @binding(3) var<storage, read> src_b: array<u32>;
@group(0) @binding(4) var<storage, read_write> dst: array<u32>;

override COND_DT: u32 = 0u;
override IN_DT: u32 = 0u;

fn cond_at(e: u32) -> bool {
    let ic = p.off_c + strided_offset(e, p.rank, p.shape, p.strides_c);
    let w = word_index(ic, COND_DT);
    if COND_DT == 4u {
        return (src_c[w] | src_c[w + 1u]) != 0u;
    }
    return decode(src_c[w], ic, COND_DT) != 0.0;
}

fn value_at(e: u32) -> f32 {
    if cond_at(e) {
        let ia = p.off_a + strided_offset(e, p.rank, p.shape, p.strides_a);
        return decode(src_a[word_index(ia, IN_DT)], ia, IN_DT);
    }
    let ib = p.off_b + strided_offset(e, p.rank, p.shape, p.strides_b);
    return decode(src_b[word_index(ib, IN_DT)], ib, IN_DT);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    write_unit(group_index(wid, nwg) * WG + lid, p.n);
}
