// reduce.wgsl — one workgroup per output unit reduces rows of the last
// dimension: OP 0 sum, 1 mean, 2 max, 3 min, 4 argmax, 5 argmin (first
// index among equals). Rows may be any strided view: row r starts at
// offset + strided_offset(r, outer shape, outer strides), its elements are
// `stride` apart. For 16-bit outputs a workgroup reduces two rows and
// writes their shared word.
//
// Long rows go in two passes (PHASE): in pass 1 workgroup (c, r) reduces
// chunk c (`chunk` elements) of row r and writes its value and index as a
// pair of words to dst[r][c]; in pass 2 one workgroup per row reduces the
// `parts` pairs of its row (src is then pass 1's output) as above.

struct Params {
    rows: u32,
    n: u32,
    rank: u32,
    offset: u32,
    stride: u32,
    // elements per chunk in pass 1; chunks per row (pass 2's row length)
    chunk: u32,
    parts: u32,
    _pad2: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

override OP: u32 = 0u;
override SRC_DT: u32 = 0u;
override OUT_DT: u32 = 0u;
// 0 one pass, 1 partial results of chunks, 2 the rows of those partials
override PHASE: u32 = 0u;

const NO_INDEX: u32 = 0xffffffffu;

var<workgroup> vals: array<f32, 256>;
var<workgroup> idxs: array<u32, 256>;

fn load(i: u32) -> f32 {
    return decode(src[word_index(i, SRC_DT)], i, SRC_DT);
}

// Whether (v, i) beats (bv, bi) for max/min-like ops.
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    let ties = v == bv && i < bi;
    if OP == 2u || OP == 4u {
        return v > bv || ties;
    }
    return v < bv || ties;
}

// The reduction of elements k0..k1 of row r: the value, and for the
// index ops the index (NO_INDEX if none), both held by every thread.
fn reduce_range(r: u32, lid: u32, k0: u32, k1: u32) -> vec2<u32> {
    var acc = 0.0;
    if OP == 2u || OP == 4u {
        acc = bitcast<f32>(0xff800000u); // -inf
    } else if OP == 3u || OP == 5u {
        acc = bitcast<f32>(0x7f800000u); // +inf
    }
    var at = NO_INDEX;
    if PHASE == 2u {
        // the pairs of pass 1: (value, index) of each chunk
        let base = 2u * r * p.parts;
        for (var j = lid; j < p.parts; j += WG) {
            let v = bitcast<f32>(src[base + 2u * j]);
            let i = src[base + 2u * j + 1u];
            if OP <= 1u {
                acc += v;
            } else if better(v, i, acc, at) {
                acc = v;
                at = i;
            }
        }
    } else {
        let base = p.offset + strided_offset(r, p.rank, p.shape, p.strides);
        for (var k = k0 + lid; k < k1; k += WG) {
            let v = load(base + k * p.stride);
            if OP <= 1u {
                acc += v;
            } else if better(v, k, acc, at) {
                acc = v;
                at = k;
            }
        }
    }
    vals[lid] = acc;
    idxs[lid] = at;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            if OP <= 1u {
                vals[lid] += vals[lid + s];
            } else if better(vals[lid + s], idxs[lid + s], vals[lid], idxs[lid]) {
                vals[lid] = vals[lid + s];
                idxs[lid] = idxs[lid + s];
            }
        }
        workgroupBarrier();
    }
    let out = vec2<u32>(bitcast<u32>(vals[0]), idxs[0]);
    // the next row reuses the arrays
    workgroupBarrier();
    return out;
}

// The result of row r as the op defines it.
fn reduce_row(r: u32, lid: u32) -> f32 {
    let red = reduce_range(r, lid, 0u, p.n);
    let total = bitcast<f32>(red.x);
    if OP == 1u {
        return total / f32(p.n);
    }
    if OP >= 4u {
        return f32(red.y);
    }
    return total;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    if PHASE == 1u {
        // workgroup g: chunk g % parts of row g / parts
        let r = g / p.parts;
        if r >= p.rows {
            return;
        }
        let c = g % p.parts;
        let k0 = c * p.chunk;
        let red = reduce_range(r, lid, k0, min(k0 + p.chunk, p.n));
        if lid == 0u {
            dst[2u * g] = red.x;
            dst[2u * g + 1u] = red.y;
        }
        return;
    }
    if OUT_DT == 1u || OUT_DT == 2u {
        let r = 2u * g;
        if r >= p.rows {
            return;
        }
        let lo = reduce_row(r, lid);
        var hi = 0.0;
        if r + 1u < p.rows {
            hi = reduce_row(r + 1u, lid);
        }
        if lid == 0u {
            dst[g] = encode_pair(lo, hi, OUT_DT);
        }
    } else {
        if g >= p.rows {
            return;
        }
        let v = reduce_row(g, lid);
        if lid == 0u {
            if OUT_DT == 3u {
                dst[g] = u32(v);
            } else {
                dst[g] = bitcast<u32>(v);
            }
        }
    }
}
