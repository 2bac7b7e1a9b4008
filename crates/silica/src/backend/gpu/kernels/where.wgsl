// where.wgsl — dst = cond != 0 ? a : b elementwise over three views
// broadcast to one shape, moving the chosen element's bits (any dtype of
// a and b, ELEM_BYTES 2, 4 or 8). The condition may have any dtype.
// Thread `u` owns output word `u` (two 16-bit elements) or element `u`.

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
override ELEM_BYTES: u32 = 4u;

fn cond_at(e: u32) -> bool {
    let ic = p.off_c + strided_offset(e, p.rank, p.shape, p.strides_c);
    let w = word_index(ic, COND_DT);
    if COND_DT == 4u {
        return (src_c[w] | src_c[w + 1u]) != 0u;
    }
    return decode(src_c[w], ic, COND_DT) != 0.0;
}

fn index_a(e: u32) -> u32 {
    return p.off_a + strided_offset(e, p.rank, p.shape, p.strides_a);
}

fn index_b(e: u32) -> u32 {
    return p.off_b + strided_offset(e, p.rank, p.shape, p.strides_b);
}

// The chosen 16-bit element `e`, in the low half.
fn pick_half(e: u32) -> u32 {
    if cond_at(e) {
        let i = index_a(e);
        return (src_a[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
    }
    let i = index_b(e);
    return (src_b[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let u = group_index(wid, nwg) * WG + lid;
    if ELEM_BYTES == 2u {
        let e = 2u * u;
        if e >= p.n {
            return;
        }
        var w = pick_half(e);
        if e + 1u < p.n {
            w |= pick_half(e + 1u) << 16u;
        }
        dst[u] = w;
        return;
    }
    if u >= p.n {
        return;
    }
    let c = cond_at(u);
    if ELEM_BYTES == 8u {
        if c {
            let i = index_a(u);
            dst[2u * u] = src_a[2u * i];
            dst[2u * u + 1u] = src_a[2u * i + 1u];
        } else {
            let i = index_b(u);
            dst[2u * u] = src_b[2u * i];
            dst[2u * u + 1u] = src_b[2u * i + 1u];
        }
    } else if c {
        dst[u] = src_a[index_a(u)];
    } else {
        dst[u] = src_b[index_b(u)];
    }
}
