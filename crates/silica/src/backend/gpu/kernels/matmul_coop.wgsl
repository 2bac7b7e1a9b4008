// matmul_coop.wgsl — dst[z] = a[z] @ b[z] for f16 operands on cooperative
// matrices, f32 accumulation, for any layout and size. The fragment file
// before this one sets the fragment side FRAG: 16 on NVIDIA through Vulkan
// (tensor cores), 8 on Apple GPUs through Metal (simdgroup matrices).
//
// A workgroup of SG subgroups of 32 computes a TM x TN tile of dst, TM =
// 8 FRAG and TN = SG FRAG (128x128 for FRAG 16 and 8 subgroups, 64x32 for
// FRAG 8 and 4). Subgroup s owns rows (s / (SG / 2)) * 4 FRAG .. +4 FRAG
// and columns (s % (SG / 2)) * 2 FRAG .. +2 FRAG: 4x2 fragments. Per step
// of 32 along k, the workgroup stages a (TM x 32, row-major) and b (32 x
// TN: n-major when b is a transposed weight, else k-major) in workgroup
// memory as f16, then each subgroup loads its fragments from there. The
// tiles are arrays of f16, which both SPIR-V and MSL load fragments from
// with a stride in halves. Edges are zero-filled, so any M, N, K work.
// The accumulators go out through coop_store.wgsl. Params from
// matmul_common.wgsl; operand loading modes as in matmul_big.wgsl (A_VEC,
// B_MODE), with 8-half vec4 words.
// The launcher picks it only on adapters whose subgroups are exactly 32
// wide and that offer FRAG x FRAG f16 -> f32 cooperative matrices.

@group(0) @binding(1) var<storage, read> src_a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<u32>>;

override OUT_DT: u32 = 0u;
override A_VEC: bool = false;
override B_MODE: u32 = 0u;
// Subgroups per workgroup: 8, or 4 (the tile then has half the columns).
override SG: u32 = 8u;

const TM: u32 = 8u * FRAG;
const TK: u32 = 32u;
// Row pitch (in halves) of the [TM][32] and [TN][32] tiles, padded against
// bank conflicts.
const LDK: u32 = 40u;
// Row pitch of the k-major [32][TN] b tile, sized for 8 subgroups.
const LDN: u32 = 8u * FRAG + 8u;

var<workgroup> tile_a: array<f16, TM * LDK>;
var<workgroup> tile_b: array<f16, max(TM * LDK, TK * LDN)>;
var<workgroup> scratch: array<f32, 8u * FRAG * FRAG>; // [SG][FRAG * FRAG]

fn elem_a(e: u32) -> f16 {
    let w = e >> 1u;
    return f16(decode(src_a[w >> 2u][w & 3u], e, 1u));
}

fn elem_b(e: u32) -> f16 {
    let w = e >> 1u;
    return f16(decode(src_b[w >> 2u][w & 3u], e, 1u));
}

// Writes the eight halves of vec4 word `q` to tile_a from index i on.
fn put8_a(i: u32, q: vec4<u32>) {
    let h0 = vec2<f16>(unpack2x16float(q.x));
    let h1 = vec2<f16>(unpack2x16float(q.y));
    let h2 = vec2<f16>(unpack2x16float(q.z));
    let h3 = vec2<f16>(unpack2x16float(q.w));
    tile_a[i] = h0.x;
    tile_a[i + 1u] = h0.y;
    tile_a[i + 2u] = h1.x;
    tile_a[i + 3u] = h1.y;
    tile_a[i + 4u] = h2.x;
    tile_a[i + 5u] = h2.y;
    tile_a[i + 6u] = h3.x;
    tile_a[i + 7u] = h3.y;
}

fn put8_b(i: u32, q: vec4<u32>) {
    let h0 = vec2<f16>(unpack2x16float(q.x));
    let h1 = vec2<f16>(unpack2x16float(q.y));
    let h2 = vec2<f16>(unpack2x16float(q.z));
    let h3 = vec2<f16>(unpack2x16float(q.w));
    tile_b[i] = h0.x;
    tile_b[i + 1u] = h0.y;
    tile_b[i + 2u] = h1.x;
    tile_b[i + 3u] = h1.y;
    tile_b[i + 4u] = h2.x;
    tile_b[i + 5u] = h2.y;
    tile_b[i + 6u] = h3.x;
    tile_b[i + 7u] = h3.y;
}

fn load_a(a0: u32, row0: u32, kt: u32, lid: u32) {
    let threads = SG * 32u;
    if A_VEC {
        // TM rows of 4 runs of 8
        for (var g = lid; g < TM * 4u; g += threads) {
            let r = g >> 2u;
            let kq = (g & 3u) * 8u;
            let gr = row0 + r;
            let gk = kt + kq;
            let e = a0 + gr * p.sa_m + gk;
            let t = r * LDK + kq;
            if gr < p.m && gk + 8u <= p.k {
                put8_a(t, src_a[e >> 3u]);
            } else {
                for (var j = 0u; j < 8u; j++) {
                    var v = f16(0.0);
                    if gr < p.m && gk + j < p.k {
                        v = elem_a(e + j);
                    }
                    tile_a[t + j] = v;
                }
            }
        }
    } else {
        for (var idx = lid; idx < TM * TK; idx += threads) {
            let r = idx / TK;
            let k = idx % TK;
            var v = f16(0.0);
            if row0 + r < p.m && kt + k < p.k {
                v = elem_a(a0 + (row0 + r) * p.sa_m + (kt + k) * p.sa_k);
            }
            tile_a[r * LDK + k] = v;
        }
    }
}

fn load_b(b0: u32, col0: u32, kt: u32, lid: u32) {
    let threads = SG * 32u;
    let tn = SG * FRAG;
    if B_MODE == 1u {
        // n-major [TN][LDK]: each column's k run is contiguous
        for (var g = lid; g < tn * 4u; g += threads) {
            let c = g >> 2u;
            let kq = (g & 3u) * 8u;
            let gc = col0 + c;
            let gk = kt + kq;
            let e = b0 + gc * p.sb_n + gk;
            let t = c * LDK + kq;
            if gc < p.n && gk + 8u <= p.k {
                put8_b(t, src_b[e >> 3u]);
            } else {
                for (var j = 0u; j < 8u; j++) {
                    var v = f16(0.0);
                    if gc < p.n && gk + j < p.k {
                        v = elem_b(e + j);
                    }
                    tile_b[t + j] = v;
                }
            }
        }
    } else if B_MODE == 2u {
        // k-major [TK][LDN]: TK rows of tn / 8 runs
        let runs = tn / 8u;
        for (var g = lid; g < TK * runs; g += threads) {
            let k = g / runs;
            let cq = (g % runs) * 8u;
            let gk = kt + k;
            let gc = col0 + cq;
            let e = b0 + gk * p.sb_k + gc;
            let t = k * LDN + cq;
            if gk < p.k && gc + 8u <= p.n {
                put8_b(t, src_b[e >> 3u]);
            } else {
                for (var j = 0u; j < 8u; j++) {
                    var v = f16(0.0);
                    if gk < p.k && gc + j < p.n {
                        v = elem_b(e + j);
                    }
                    tile_b[t + j] = v;
                }
            }
        }
    } else {
        // any strides, k-major [TK][LDN]
        for (var idx = lid; idx < TK * tn; idx += threads) {
            let k = idx / tn;
            let c = idx % tn;
            var v = f16(0.0);
            if kt + k < p.k && col0 + c < p.n {
                v = elem_b(b0 + (kt + k) * p.sb_k + (col0 + c) * p.sb_n);
            }
            tile_b[k * LDN + c] = v;
        }
    }
}

fn load_frag_b(c: u32, ks: u32) -> FragB {
    if B_MODE == 1u {
        // column-major: element (k, n) at n * LDK + k
        let at = c * LDK + ks;
        return coopLoad<FragB>(&tile_b[at], LDK);
    }
    let at = ks * LDN + c;
    return coopLoadT<FragB>(&tile_b[at], LDN);
}

fn load_frag_a(r: u32, ks: u32) -> FragA {
    let at = r * LDK + ks;
    return coopLoadT<FragA>(&tile_a[at], LDK);
}

@compute @workgroup_size(SG * 32u)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z;
    let a0 = p.off_a + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_a);
    let b0 = p.off_b + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_b);
    let row0 = wid.y * TM;
    let col0 = wid.x * SG * FRAG;
    let sg = lid / 32u;
    let lane = lid % 32u;
    let wr = (sg / (SG / 2u)) * 4u * FRAG;
    let wc = (sg % (SG / 2u)) * 2u * FRAG;
    var c00 = FragC();
    var c01 = FragC();
    var c10 = FragC();
    var c11 = FragC();
    var c20 = FragC();
    var c21 = FragC();
    var c30 = FragC();
    var c31 = FragC();
    for (var kt = 0u; kt < p.k; kt += TK) {
        load_a(a0, row0, kt, lid);
        load_b(b0, col0, kt, lid);
        workgroupBarrier();
        for (var ks = 0u; ks < TK; ks += FRAG) {
            let b0f = load_frag_b(wc, ks);
            let b1f = load_frag_b(wc + FRAG, ks);
            let a0f = load_frag_a(wr, ks);
            c00 = coopMultiplyAdd(a0f, b0f, c00);
            c01 = coopMultiplyAdd(a0f, b1f, c01);
            let a1f = load_frag_a(wr + FRAG, ks);
            c10 = coopMultiplyAdd(a1f, b0f, c10);
            c11 = coopMultiplyAdd(a1f, b1f, c11);
            let a2f = load_frag_a(wr + 2u * FRAG, ks);
            c20 = coopMultiplyAdd(a2f, b0f, c20);
            c21 = coopMultiplyAdd(a2f, b1f, c21);
            let a3f = load_frag_a(wr + 3u * FRAG, ks);
            c30 = coopMultiplyAdd(a3f, b0f, c30);
            c31 = coopMultiplyAdd(a3f, b1f, c31);
        }
        workgroupBarrier();
    }
    let out0 = z * p.m * p.n;
    let r = row0 + wr;
    let c = col0 + wc;
    let own = vec2<u32>(0u);
    store_frag(c00, sg, lane, out0, r, c, own);
    store_frag(c01, sg, lane, out0, r, c + FRAG, own);
    store_frag(c10, sg, lane, out0, r + FRAG, c, own);
    store_frag(c11, sg, lane, out0, r + FRAG, c + FRAG, own);
    store_frag(c20, sg, lane, out0, r + 2u * FRAG, c, own);
    store_frag(c21, sg, lane, out0, r + 2u * FRAG, c + FRAG, own);
    store_frag(c30, sg, lane, out0, r + 3u * FRAG, c, own);
    store_frag(c31, sg, lane, out0, r + 3u * FRAG, c + FRAG, own);
}
