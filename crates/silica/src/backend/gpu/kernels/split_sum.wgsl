// split_sum.wgsl — dst = the sum of `parts` f32 arrays of n elements laid
// end to end in src (the partial products of a split K, qmatmul_coop.wgsl),
// in OUT_DT (store.wgsl). With a pitch, each part is a matrix of `cols`
// columns whose rows start `pitch` apart and whose row count is padded to
// a multiple of 16 (qmatmul_narrow.wgsl's fragments). With RES, the
// residual `res` (in OUT_DT, from element `res_off`) is added as well, so
// that a product followed by a residual add rounds once and needs no
// dispatch of its own.

struct Params {
    n: u32,
    parts: u32,
    // columns of dst, and the row pitch of the parts (0: none)
    cols: u32,
    pitch: u32,
    // the residual's first element
    res_off: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> res: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override RES: bool = false;

// Element `e` of the residual, in OUT_DT (f32, f16 or bf16).
fn residual_at(e: u32) -> f32 {
    let i = p.res_off + e;
    switch OUT_DT {
        case 1u: {
            let pair = unpack2x16float(res[i / 2u]);
            return select(pair.x, pair.y, i % 2u == 1u);
        }
        case 2u: {
            let w = res[i / 2u];
            return bitcast<f32>(select(w << 16u, w & 0xffff0000u, i % 2u == 1u));
        }
        default: {
            return bitcast<f32>(res[i]);
        }
    }
}

// The sum of the parts at word `at` of the first, parts `stride` apart.
fn parts_at(at: u32, stride: u32) -> f32 {
    var s = src[at];
    for (var j = 1u; j < p.parts; j++) {
        s += src[j * stride + at];
    }
    return s;
}

fn value_at(e: u32) -> f32 {
    var s = 0.0;
    if p.pitch != 0u {
        let at = e / p.cols * p.pitch + e % p.cols;
        s = parts_at(at, (p.n / p.cols + 15u) / 16u * 16u * p.pitch);
    } else {
        s = parts_at(e, p.n);
    }
    if RES {
        s += residual_at(e);
    }
    return s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    write_unit(group_index(wid, nwg) * WG + lid, p.n);
}
