// binary_vec.wgsl — dst = f(a, b) (or f(a, scalar) when B_SCALAR) for
// float operands of one dtype laid out as rows of whole vec4 words (4 f32
// or 8 halves): a contiguous run, or rows whose starts are `row_a` and
// `row_b` words apart (the halves of a stacked product's output, a
// broadcast row). Thread q reads and writes vec4 word q of the contiguous
// output. In a contiguous run the last word may hold elements past n: they
// are computed from whatever the buffers hold there (still inside them, as
// every buffer is a multiple of 16 bytes) and not stored.

struct Params {
    n: u32,
    // operand offsets in vec4 words
    quad_a: u32,
    quad_b: u32,
    scalar: f32,
    // words per row, and each operand's row pitch in words
    row_quads: u32,
    row_a: u32,
    row_b: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src_a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<u32>>;

override DT: u32 = 0u;
override B_SCALAR: bool = false;

// Elements per vec4 word.
fn per_quad() -> u32 {
    return select(8u, 4u, DT == 0u);
}

fn lo16(w: u32) -> f32 {
    if DT == 1u {
        return unpack2x16float(w).x;
    }
    return bitcast<f32>(w << 16u);
}

fn hi16(w: u32) -> f32 {
    if DT == 1u {
        return unpack2x16float(w).y;
    }
    return bitcast<f32>(w & 0xffff0000u);
}

fn pair(wa: u32, wb: u32) -> u32 {
    var blo = p.scalar;
    var bhi = p.scalar;
    if !B_SCALAR {
        blo = lo16(wb);
        bhi = hi16(wb);
    }
    return encode_pair(apply_binary(lo16(wa), blo), apply_binary(hi16(wa), bhi), DT);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let q = group_index(wid, nwg) * WG + lid;
    let e0 = q * per_quad();
    if e0 >= p.n {
        return;
    }
    let row = q / p.row_quads;
    let col = q - row * p.row_quads;
    let a = src_a[p.quad_a + row * p.row_a + col];
    var b = vec4<u32>(0u);
    if !B_SCALAR {
        b = src_b[p.quad_b + row * p.row_b + col];
    }
    var r: vec4<u32>;
    if DT == 0u {
        let fa = bitcast<vec4<f32>>(a);
        var fb = vec4<f32>(p.scalar);
        if !B_SCALAR {
            fb = bitcast<vec4<f32>>(b);
        }
        r = bitcast<vec4<u32>>(vec4<f32>(
            apply_binary(fa.x, fb.x),
            apply_binary(fa.y, fb.y),
            apply_binary(fa.z, fb.z),
            apply_binary(fa.w, fb.w)
        ));
    } else {
        r = vec4<u32>(pair(a.x, b.x), pair(a.y, b.y), pair(a.z, b.z), pair(a.w, b.w));
    }
    if e0 + per_quad() <= p.n {
        dst[q] = r;
    } else {
        // the words of the last, partial quad that hold elements below n
        let per_word = per_quad() / 4u;
        for (var j = 0u; j < 4u; j++) {
            if e0 + j * per_word < p.n {
                dst[q][j] = r[j];
            }
        }
    }
}
