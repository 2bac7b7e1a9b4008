// matmul_big.wgsl — dst[z] = a[z] @ b[z] for large M and N: a 16x16
// workgroup computes a 128x128 tile of dst, 8x8 per thread (rows ty*4..+4
// and 64+ty*4..+4, the same split for columns, so that the four vec4 reads
// of a k step are conflict-free), staging 128x16 of a and 16x128 of b in
// workgroup memory per step. Each thread fetches its part of the next
// step's slices into registers before the products of this step, so that
// the loads are in flight while it computes; where the tile and the step
// lie inside the operands, those vector fetches skip their edge tests.
// Four f32 outputs on a 16-byte boundary leave in one store (store4.wgsl).
//
// The TK products of a step are written out as TK calls, not a loop:
// NVIDIA's compiler keeps a loop, and the written-out steps are faster
// although the driver then gives the f32 vector specializations about 145
// registers a thread, so that one workgroup runs per SM instead of two.
// Neither a form that keeps two workgroups an SM nor one that spends the
// spare registers (longer steps, two stages, wider tiles) is faster, and
// the bank conflicts of the transposing stores cost less than swizzled or
// padded tile columns (docs/tuning.md, "f32 matmul tile").
//
// Params from matmul_common.wgsl; a and b are bound as arrays of vec4
// words (every pool buffer is a multiple of 16 bytes) so that operands
// contiguous along the loaded dimension are read four elements at a time:
// - A_VEC: a is contiguous along k (sa_k = 1) with every row start a
//   multiple of 4 elements;
// - B_MODE 1: b contiguous along k (a transposed [N, K] weight), 2: b
//   contiguous along n (row-major [K, N]); 0: any strides, one element at a
//   time (as A_VEC false).
// f16 halves are converted with unpack2x16float on the vector paths.

@group(0) @binding(1) var<storage, read> src_a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<u32>>;

override IN_DT: u32 = 0u;
override OUT_DT: u32 = 0u;
override A_VEC: bool = false;
override B_MODE: u32 = 0u;

const TILE: u32 = 128u;
// main writes out TK calls of products
const TK: u32 = 16u;
// vec4 words a thread fetches of each operand per step, and of a row's
// TK elements
const FV: u32 = TK / 8u;
const QK: u32 = TK / 4u;
// vec4 slots per k row of a tile
const SLOTS: u32 = 32u;

var<workgroup> tile_a: array<vec4<f32>, TK * SLOTS>; // [TK][TILE / 4]
var<workgroup> tile_b: array<vec4<f32>, TK * SLOTS>; // [TK][TILE / 4]

fn elem_a(e: u32) -> f32 {
    let w = word_index(e, IN_DT);
    return decode(src_a[w >> 2u][w & 3u], e, IN_DT);
}

fn elem_b(e: u32) -> f32 {
    let w = word_index(e, IN_DT);
    return decode(src_b[w >> 2u][w & 3u], e, IN_DT);
}

// Four elements from e on (e a multiple of 4), from the vec4 word `q`
// (f32) or the two words of it that hold them (16-bit types).
fn unpack4(q: vec4<u32>, e: u32) -> vec4<f32> {
    if IN_DT == 0u {
        return bitcast<vec4<f32>>(q);
    }
    var w = q.xy;
    if (e & 4u) != 0u {
        w = q.zw;
    }
    if IN_DT == 1u {
        return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
    }
    return vec4<f32>(
        bitcast<f32>(w.x << 16u),
        bitcast<f32>(w.x & 0xffff0000u),
        bitcast<f32>(w.y << 16u),
        bitcast<f32>(w.y & 0xffff0000u)
    );
}

fn quad_index(e: u32) -> u32 {
    if IN_DT == 0u {
        return e >> 2u;
    }
    return e >> 3u;
}

// Word i of a step's fetch (FV vec4 a thread for each operand).
fn at_word(v: array<vec4<f32>, FV>, i: u32) -> f32 {
    return v[i >> 2u][i & 3u];
}

// This thread's part of a[row0.., kt..kt + TK] (zeros past the edges): FV
// runs of 4 along k (A_VEC), or 4 * FV elements one at a time. `full`: the
// whole slice lies inside a (and b), so the vector paths load without
// edge tests.
fn fetch_a(a0: u32, row0: u32, kt: u32, lid: u32, full: bool) -> array<vec4<f32>, FV> {
    var out: array<vec4<f32>, FV>;
    if A_VEC {
        for (var i = 0u; i < FV; i++) {
            let g = lid + i * 256u;
            let gr = row0 + g / QK;
            let gk = kt + (g % QK) * 4u;
            let e = a0 + gr * p.sa_m + gk;
            var v = vec4<f32>(0.0);
            if full {
                v = unpack4(src_a[quad_index(e)], e);
            } else if gr < p.m && gk + 4u <= p.k {
                v = unpack4(src_a[quad_index(e)], e);
            } else if gr < p.m {
                for (var j = 0u; j < 4u; j++) {
                    if gk + j < p.k {
                        v[j] = elem_a(e + j);
                    }
                }
            }
            out[i] = v;
        }
    } else {
        for (var i = 0u; i < 4u * FV; i++) {
            // consecutive threads along k (contiguous for row-major a)
            let idx = lid + i * 256u;
            let r = idx / TK;
            let k = idx % TK;
            var v = 0.0;
            if row0 + r < p.m && kt + k < p.k {
                v = elem_a(a0 + (row0 + r) * p.sa_m + (kt + k) * p.sa_k);
            }
            out[i >> 2u][i & 3u] = v;
        }
    }
    return out;
}

// Puts a fetch of a into tile_a (k-major).
fn put_a(lid: u32, v: array<vec4<f32>, FV>) {
    if A_VEC {
        for (var i = 0u; i < FV; i++) {
            let g = lid + i * 256u;
            let r = g / QK;
            let kq = (g % QK) * 4u;
            for (var j = 0u; j < 4u; j++) {
                tile_a[(kq + j) * SLOTS + (r >> 2u)][r & 3u] = v[i][j];
            }
        }
    } else {
        for (var i = 0u; i < 4u * FV; i++) {
            let idx = lid + i * 256u;
            let r = idx / TK;
            tile_a[(idx % TK) * SLOTS + (r >> 2u)][r & 3u] = at_word(v, i);
        }
    }
}

// The column and k of element i of a thread's fetch of b on the scalar
// path.
fn b_place(lid: u32, i: u32) -> vec2<u32> {
    let idx = lid + i * 256u;
    if p.sb_k == 1u {
        return vec2<u32>(idx / TK, idx % TK);
    }
    return vec2<u32>(idx % TILE, idx / TILE);
}

// This thread's part of b[kt..kt + TK, col0..] (zeros past the edges;
// `full` as for fetch_a).
fn fetch_b(b0: u32, col0: u32, kt: u32, lid: u32, full: bool) -> array<vec4<f32>, FV> {
    var out: array<vec4<f32>, FV>;
    if B_MODE == 1u {
        for (var i = 0u; i < FV; i++) {
            let g = lid + i * 256u;
            let gc = col0 + g / QK;
            let gk = kt + (g % QK) * 4u;
            let e = b0 + gc * p.sb_n + gk;
            var v = vec4<f32>(0.0);
            if full {
                v = unpack4(src_b[quad_index(e)], e);
            } else if gc < p.n && gk + 4u <= p.k {
                v = unpack4(src_b[quad_index(e)], e);
            } else if gc < p.n {
                for (var j = 0u; j < 4u; j++) {
                    if gk + j < p.k {
                        v[j] = elem_b(e + j);
                    }
                }
            }
            out[i] = v;
        }
    } else if B_MODE == 2u {
        for (var i = 0u; i < FV; i++) {
            let g = lid + i * 256u;
            let gk = kt + g / SLOTS;
            let gc = col0 + (g % SLOTS) * 4u;
            let e = b0 + gk * p.sb_k + gc;
            var v = vec4<f32>(0.0);
            if full {
                v = unpack4(src_b[quad_index(e)], e);
            } else if gk < p.k && gc + 4u <= p.n {
                v = unpack4(src_b[quad_index(e)], e);
            } else if gk < p.k {
                for (var j = 0u; j < 4u; j++) {
                    if gc + j < p.n {
                        v[j] = elem_b(e + j);
                    }
                }
            }
            out[i] = v;
        }
    } else {
        for (var i = 0u; i < 4u * FV; i++) {
            let ck = b_place(lid, i);
            var v = 0.0;
            if kt + ck.y < p.k && col0 + ck.x < p.n {
                v = elem_b(b0 + (kt + ck.y) * p.sb_k + (col0 + ck.x) * p.sb_n);
            }
            out[i >> 2u][i & 3u] = v;
        }
    }
    return out;
}

// Puts a fetch of b into tile_b (k-major).
fn put_b(lid: u32, v: array<vec4<f32>, FV>) {
    if B_MODE == 1u {
        for (var i = 0u; i < FV; i++) {
            let g = lid + i * 256u;
            let c = g / QK;
            let kq = (g % QK) * 4u;
            for (var j = 0u; j < 4u; j++) {
                tile_b[(kq + j) * SLOTS + (c >> 2u)][c & 3u] = v[i][j];
            }
        }
    } else if B_MODE == 2u {
        for (var i = 0u; i < FV; i++) {
            tile_b[lid + i * 256u] = v[i];
        }
    } else {
        for (var i = 0u; i < 4u * FV; i++) {
            let ck = b_place(lid, i);
            tile_b[ck.y * SLOTS + (ck.x >> 2u)][ck.x & 3u] = at_word(v, i);
        }
    }
}

// Step kk of the products from the staged tiles: acc[2 * i + h] holds row
// i of the thread (i < 4: ty * 4 + i, else 64 + ty * 4 + i - 4) at the
// columns of half h (tx * 4.., 64 + tx * 4..).
fn products(kk: u32, tx: u32, ty: u32, acc: ptr<function, array<vec4<f32>, 16>>) {
    let a_lo = tile_a[kk * SLOTS + ty];
    let a_hi = tile_a[kk * SLOTS + 16u + ty];
    let b_lo = tile_b[kk * SLOTS + tx];
    let b_hi = tile_b[kk * SLOTS + 16u + tx];
    (*acc)[0] = fma(vec4<f32>(a_lo.x), b_lo, (*acc)[0]);
    (*acc)[1] = fma(vec4<f32>(a_lo.x), b_hi, (*acc)[1]);
    (*acc)[2] = fma(vec4<f32>(a_lo.y), b_lo, (*acc)[2]);
    (*acc)[3] = fma(vec4<f32>(a_lo.y), b_hi, (*acc)[3]);
    (*acc)[4] = fma(vec4<f32>(a_lo.z), b_lo, (*acc)[4]);
    (*acc)[5] = fma(vec4<f32>(a_lo.z), b_hi, (*acc)[5]);
    (*acc)[6] = fma(vec4<f32>(a_lo.w), b_lo, (*acc)[6]);
    (*acc)[7] = fma(vec4<f32>(a_lo.w), b_hi, (*acc)[7]);
    (*acc)[8] = fma(vec4<f32>(a_hi.x), b_lo, (*acc)[8]);
    (*acc)[9] = fma(vec4<f32>(a_hi.x), b_hi, (*acc)[9]);
    (*acc)[10] = fma(vec4<f32>(a_hi.y), b_lo, (*acc)[10]);
    (*acc)[11] = fma(vec4<f32>(a_hi.y), b_hi, (*acc)[11]);
    (*acc)[12] = fma(vec4<f32>(a_hi.z), b_lo, (*acc)[12]);
    (*acc)[13] = fma(vec4<f32>(a_hi.z), b_hi, (*acc)[13]);
    (*acc)[14] = fma(vec4<f32>(a_hi.w), b_lo, (*acc)[14]);
    (*acc)[15] = fma(vec4<f32>(a_hi.w), b_hi, (*acc)[15]);
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z;
    let a0 = p.off_a + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_a);
    let b0 = p.off_b + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_b);
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    let tx = lid3.x;
    let ty = lid3.y;
    var acc: array<vec4<f32>, 16>;
    // the next step's slices are fetched while this step's products run
    // (past K the fetches give zeros and load nothing); `inside`: the tile
    // lies inside dst
    let inside = row0 + TILE <= p.m && col0 + TILE <= p.n;
    var fa = fetch_a(a0, row0, 0u, lid, inside && TK <= p.k);
    var fb = fetch_b(b0, col0, 0u, lid, inside && TK <= p.k);
    for (var kt = 0u; kt < p.k; kt += TK) {
        put_a(lid, fa);
        put_b(lid, fb);
        workgroupBarrier();
        let full = inside && kt + 2u * TK <= p.k;
        fa = fetch_a(a0, row0, kt + TK, lid, full);
        fb = fetch_b(b0, col0, kt + TK, lid, full);
        // the TK steps written out (see the top of the file)
        products(0u, tx, ty, &acc);
        products(1u, tx, ty, &acc);
        products(2u, tx, ty, &acc);
        products(3u, tx, ty, &acc);
        products(4u, tx, ty, &acc);
        products(5u, tx, ty, &acc);
        products(6u, tx, ty, &acc);
        products(7u, tx, ty, &acc);
        products(8u, tx, ty, &acc);
        products(9u, tx, ty, &acc);
        products(10u, tx, ty, &acc);
        products(11u, tx, ty, &acc);
        products(12u, tx, ty, &acc);
        products(13u, tx, ty, &acc);
        products(14u, tx, ty, &acc);
        products(15u, tx, ty, &acc);
        workgroupBarrier();
    }
    let out0 = z * p.m * p.n;
    let r = row0 + ty * 4u;
    let c = col0 + tx * 4u;
    store4(out0, r, c, acc[0]);
    store4(out0, r, c + 64u, acc[1]);
    store4(out0, r + 1u, c, acc[2]);
    store4(out0, r + 1u, c + 64u, acc[3]);
    store4(out0, r + 2u, c, acc[4]);
    store4(out0, r + 2u, c + 64u, acc[5]);
    store4(out0, r + 3u, c, acc[6]);
    store4(out0, r + 3u, c + 64u, acc[7]);
    store4(out0, r + 64u, c, acc[8]);
    store4(out0, r + 64u, c + 64u, acc[9]);
    store4(out0, r + 65u, c, acc[10]);
    store4(out0, r + 65u, c + 64u, acc[11]);
    store4(out0, r + 66u, c, acc[12]);
    store4(out0, r + 66u, c + 64u, acc[13]);
    store4(out0, r + 67u, c, acc[14]);
    store4(out0, r + 67u, c + 64u, acc[15]);
}
