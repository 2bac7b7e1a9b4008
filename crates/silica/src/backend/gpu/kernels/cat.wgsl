// cat.wgsl — writes one input of a concatenation into its slot of the
// contiguous output, bitwise. The output is seen as `rows` rows of
// `row_stride` elements; this input fills `len` elements of each row from
// element `start`. One dispatch per input.
//
// For 16-bit dtypes a thread owns one output word and keeps the half that
// belongs to a neighbouring input. Two rows of this input never share a
// word (other inputs sit between them), and when nothing sits between them
// the launcher passes a single row.

struct Params {
    rows: u32,
    len: u32,
    row_stride: u32,
    start: u32,
    words_per_row: u32,
    rank: u32,
    offset: u32,
    _pad: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

// Storage index of element `j` (row-major) of the input view.
fn src_elem(j: u32) -> u32 {
    return p.offset + strided_offset(j, p.rank, p.shape, p.strides);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = group_index(wid, nwg) * WG + lid;
    if ELEM_BYTES == 2u {
        let row = t / p.words_per_row;
        if row >= p.rows {
            return;
        }
        let base = row * p.row_stride + p.start;
        let w = (base >> 1u) + t % p.words_per_row;
        if 2u * w >= base + p.len {
            return;
        }
        var word = dst[w];
        for (var h = 0u; h < 2u; h++) {
            let e = 2u * w + h;
            if e >= base && e < base + p.len {
                let v = fetch_half(src_elem(row * p.len + e - base));
                word = (word & ~(0xffffu << (16u * h))) | (v << (16u * h));
            }
        }
        dst[w] = word;
        return;
    }
    if t >= p.rows * p.len {
        return;
    }
    let row = t / p.len;
    let e = row * p.row_stride + p.start + t % p.len;
    let i = src_elem(t);
    if ELEM_BYTES == 8u {
        dst[2u * e] = src[2u * i];
        dst[2u * e + 1u] = src[2u * i + 1u];
    } else {
        dst[e] = src[i];
    }
}
