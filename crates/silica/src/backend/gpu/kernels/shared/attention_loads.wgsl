// attention_loads.wgsl — loads from the strided views of q, k, v and mask
// (attention_params.wgsl) through `word` (attention_io.wgsl or
// attention_step_io.wgsl). Bits 0, 1, 2 of the constant FAST say that q,
// k, v have a unit last stride and (for 16-bit dtypes) even offsets and
// strides, so that a row chunk can be loaded as whole words (f16 pairs
// decoded with unpack2x16float).

// a constant, so that the branches of ld4 fold away and a kernel's loads
// can be scheduled together
override FAST: u32 = 0u;

const Q: u32 = 0u;
const K: u32 = 1u;
const V: u32 = 2u;
const MASK: u32 = 3u;

fn elem(which: u32, e: u32) -> f32 {
    return decode(word(which, word_index(e, DT)), e, DT);
}

// Elements e, e + stride, ... of input `which`: `n` of them (2 or 4, as
// head sizes are even); the missing ones are 0.
fn ld4(which: u32, e: u32, n: u32, stride: u32) -> vec4<f32> {
    var r = vec4<f32>(0.0);
    let fast = (FAST & (1u << which)) != 0u;
    if fast && DT == 1u {
        r = vec4<f32>(unpack2x16float(word(which, e >> 1u)), 0.0, 0.0);
        if n == 4u {
            r = vec4<f32>(r.xy, unpack2x16float(word(which, (e >> 1u) + 1u)));
        }
    } else if fast && DT == 2u {
        let w0 = word(which, e >> 1u);
        r.x = decode(w0, 0u, DT);
        r.y = decode(w0, 1u, DT);
        if n == 4u {
            let w1 = word(which, (e >> 1u) + 1u);
            r.z = decode(w1, 0u, DT);
            r.w = decode(w1, 1u, DT);
        }
    } else {
        let s = select(stride, 1u, fast);
        r.x = elem(which, e);
        r.y = elem(which, e + s);
        if n == 4u {
            r.z = elem(which, e + 2u * s);
            r.w = elem(which, e + 3u * s);
        }
    }
    return r;
}

// The elements of chunk `c` (dimensions 4c..4c+3) that a head of `d` has.
fn chunk_len(c: u32, d: u32) -> u32 {
    return min(4u, d - 4u * c);
}
