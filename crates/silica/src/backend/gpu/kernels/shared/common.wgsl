// common.wgsl — placed before every silica kernel.
//
// Tensor buffers are bound as array<u32> whatever their dtype, and kernels
// compute in f32. Dtype codes (DType::gpu_code): 0 f32, 1 f16, 2 bf16,
// 3 u32, 4 i64. 16-bit elements sit two to a word (element 2w in the low
// half of word w); an i64 takes two words, low word first. The f16 and bf16
// conversions are done with integer operations so that rounding (to nearest
// even), overflow to infinity and subnormals match the CPU on every GPU.

const WG: u32 = 256u;

// The word that holds element `e` of a tensor of dtype `dt`.
fn word_index(e: u32, dt: u32) -> u32 {
    if dt == 1u || dt == 2u {
        return e >> 1u;
    }
    if dt == 4u {
        return e << 1u;
    }
    return e;
}

fn f16_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    if e == 0u {
        // zero or subnormal: m * 2^-24
        let v = f32(m) * 5.9604645e-8;
        return select(v, -v, sign != 0u);
    }
    if e == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}

fn f32_to_f16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    // normal: rebias the exponent, round away 13 mantissa bits to nearest even
    let r = a - 0x38000000u;
    let normal = (r + 0xfffu + ((r >> 13u) & 1u)) >> 13u;
    // below 2^-14 (subnormal or zero): in |v| + 0.5 the float adder rounds
    // |v| to a multiple of 2^-24 (nearest even), the last place of 0.5, and
    // leaves that count in the low mantissa bits (1024 when it rounds up to
    // the smallest normal, which is that half's encoding)
    let sub = bitcast<u32>(bitcast<f32>(a) + 0.5) - 0x3f000000u;
    // computed both ways and selected: no divergent branches
    var h = select(sub, normal, a >= 0x38800000u);
    h = select(h, 0x7c00u, a >= 0x477ff000u); // rounds to 65520 or more: infinity
    h = select(h, 0x7e00u, a > 0x7f800000u); // NaN
    return sign | h;
}

fn f32_to_bf16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if (b & 0x7fffffffu) > 0x7f800000u {
        return (b >> 16u) | 0x40u; // NaN stays NaN
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// Element `e`, whose word is `w`, as f32.
fn decode(w: u32, e: u32, dt: u32) -> f32 {
    let half = (w >> ((e & 1u) * 16u)) & 0xffffu;
    switch dt {
        case 0u: {
            return bitcast<f32>(w);
        }
        case 1u: {
            return f16_to_f32(half);
        }
        case 2u: {
            return bitcast<f32>(half << 16u);
        }
        case 3u: {
            return f32(w);
        }
        default: {
            return f32(bitcast<i32>(w));
        }
    }
}

// Two values as one word of a 16-bit dtype.
fn encode_pair(lo: f32, hi: f32, dt: u32) -> u32 {
    if dt == 1u {
        return f32_to_f16(lo) | (f32_to_f16(hi) << 16u);
    }
    return f32_to_bf16(lo) | (f32_to_bf16(hi) << 16u);
}

// Storage offset (in elements, from the view's offset) of element `e` in
// row-major order of a view with `rank` dimensions. Shapes and strides come
// packed four to a vec4 (up to 8 dimensions).
fn strided_offset(e: u32, rank: u32, shape_in: array<vec4<u32>, 2>, strides_in: array<vec4<u32>, 2>) -> u32 {
    var shape = shape_in;
    var strides = strides_in;
    var rem = e;
    var off = 0u;
    for (var i = 0u; i < rank; i++) {
        let d = rank - 1u - i;
        let n = shape[d >> 2u][d & 3u];
        off += (rem % n) * strides[d >> 2u][d & 3u];
        rem /= n;
    }
    return off;
}

// Linear index of this workgroup in a grid split over x and y.
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}
