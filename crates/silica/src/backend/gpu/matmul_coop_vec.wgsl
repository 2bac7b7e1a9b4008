// matmul_coop_vec.wgsl — dst[z] = a[z] @ b[z] for f16 operands on
// cooperative matrices, with f32 accumulation. A workgroup of 4 subgroups
// of 32 computes a 128x128 tile of dst, each subgroup a 64x64 block of 4x4
// fragments of 16x16. Per step of 32 along k the workgroup copies a 128x32
// slice of a and a 32x128 slice of b into workgroup memory, 8 halves per
// load and per pair of stores, and each subgroup loads its fragments from
// there. The tiles are double-buffered: the next step's slices are loaded
// into registers before this step's products and stored after them, so
// one barrier per step suffices.
//
// The operands are read as mat2x4<f16> (16 bytes a load) and the tiles
// typed vec4<f16>: naga gives a cooperative load the scalar type of its
// pointer, so the tiles cannot be words, and a cooperative load through a
// mat2x4 pointer read wrong values on NVIDIA's driver. Through SPIR-V a
// cooperative load's stride counts the pointer's elements (vec4<f16>
// slots: PK, PN). MSL counts halves, so the launcher never picks this
// kernel on Metal (see coop16_available).
//
// Layouts (the launcher checks them): a contiguous along k with every row
// start a multiple of 8 halves (A_VEC); b contiguous along k (B_MODE 1, a
// weight stored [N, K]) or along n (B_MODE 2, N a multiple of 8); K a
// multiple of 8. Rows and columns past the edges are clamped to the last
// ones when loaded and not written; k past K loads as zeros.
// Params from matmul_common.wgsl, the store from coop_store.wgsl.

@group(0) @binding(1) var<storage, read> src_a: array<mat2x4<f16>>;
@group(0) @binding(2) var<storage, read> src_b: array<mat2x4<f16>>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override OUT_DT: u32 = 0u;
override B_MODE: u32 = 1u;

const TK: u32 = 32u;
// Row pitch of the [128][TK] tiles in vec4<f16> slots: 40 halves, 80
// bytes, so that the 8 rows of a fragment load start on distinct banks.
const PK: u32 = 10u;
// Row pitch of the k-major [TK][128] b tile: 136 halves.
const PN: u32 = 34u;
// vec4 slots per stage (the larger of 128 * PK and TK * PN).
const STAGE: u32 = 1280u;

// Two stages each; 45,056 bytes in all with the scratch, every variable a
// multiple of 16 bytes (NVIDIA places them back to back, and a fragment
// load from an address that is not a multiple of 16 bytes reads wrongly).
var<workgroup> tile_a: array<vec4<f16>, 2560>;
var<workgroup> tile_b: array<vec4<f16>, 2560>;
var<workgroup> scratch: array<f32, 1024>; // [4 subgroups][16 * 16]

const ZERO8 = mat2x4<f16>(vec4<f16>(0.0h), vec4<f16>(0.0h));

// Run g (0..511) of a[row0..+128, kt..+32]: row g / 4, halves 8 (g % 4)..+8.
fn fetch_a(a0: u32, row0: u32, kt: u32, g: u32) -> mat2x4<f16> {
    let r = min(row0 + (g >> 2u), p.m - 1u);
    let k = kt + (g & 3u) * 8u;
    if k >= p.k {
        return ZERO8;
    }
    return src_a[(a0 + r * p.sa_m + k) >> 3u];
}

// Stores run g of a in stage s ([128][PK] vec4 slots, k contiguous).
fn put_a(s: u32, g: u32, v: mat2x4<f16>) {
    let t = s + (g >> 2u) * PK + (g & 3u) * 2u;
    tile_a[t] = v[0];
    tile_a[t + 1u] = v[1];
}

// Run g of b[kt..+32, col0..+128]: B_MODE 1 as a (column g / 4), B_MODE 2
// row g / 16, columns 8 (g % 16)..+8.
fn fetch_b(b0: u32, col0: u32, kt: u32, g: u32) -> mat2x4<f16> {
    if B_MODE == 1u {
        let c = min(col0 + (g >> 2u), p.n - 1u);
        let k = kt + (g & 3u) * 8u;
        if k >= p.k {
            return ZERO8;
        }
        return src_b[(b0 + c * p.sb_n + k) >> 3u];
    }
    let k = kt + g / 16u;
    let c = min(col0 + (g % 16u) * 8u, p.n - 8u);
    if k >= p.k {
        return ZERO8;
    }
    return src_b[(b0 + k * p.sb_k + c) >> 3u];
}

// Stores run g of b in stage s: n-major like a (B_MODE 1) or k-major
// ([32][PN] vec4 slots, B_MODE 2).
fn put_b(s: u32, g: u32, v: mat2x4<f16>) {
    var t: u32;
    if B_MODE == 1u {
        t = s + (g >> 2u) * PK + (g & 3u) * 2u;
    } else {
        t = s + (g / 16u) * PN + (g % 16u) * 2u;
    }
    tile_b[t] = v[0];
    tile_b[t + 1u] = v[1];
}

// The fragment of a at tile row r, k offset ks, of stage s.
fn frag_a(s: u32, r: u32, ks: u32) -> coop_mat16x16<f16, A> {
    let at = s + r * PK + ks / 4u;
    return coopLoadT<coop_mat16x16<f16, A>>(&tile_a[at], PK);
}

// The fragment of b at tile column c, k offset ks, of stage s.
fn frag_b(s: u32, c: u32, ks: u32) -> coop_mat16x16<f16, B> {
    if B_MODE == 1u {
        let at = s + c * PK + ks / 4u;
        return coopLoad<coop_mat16x16<f16, B>>(&tile_b[at], PK);
    }
    let at = s + ks * PN + c / 4u;
    return coopLoadT<coop_mat16x16<f16, B>>(&tile_b[at], PN);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z;
    let a0 = p.off_a + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_a);
    let b0 = p.off_b + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_b);
    let sg = lid / 32u;
    let lane = lid % 32u;
    let row0 = wid.y * 128u;
    let col0 = wid.x * 128u;
    let wr = (sg / 2u) * 64u;
    let wc = (sg % 2u) * 64u;
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();
    var c2 = coop_mat16x16<f32, C>();
    var c3 = coop_mat16x16<f32, C>();
    var c4 = coop_mat16x16<f32, C>();
    var c5 = coop_mat16x16<f32, C>();
    var c6 = coop_mat16x16<f32, C>();
    var c7 = coop_mat16x16<f32, C>();
    var c8 = coop_mat16x16<f32, C>();
    var c9 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    var c14 = coop_mat16x16<f32, C>();
    var c15 = coop_mat16x16<f32, C>();
    // stage 0 holds the first step; s is the stage the products read
    var ra0 = fetch_a(a0, row0, 0u, lid);
    var ra1 = fetch_a(a0, row0, 0u, lid + 128u);
    var ra2 = fetch_a(a0, row0, 0u, lid + 256u);
    var ra3 = fetch_a(a0, row0, 0u, lid + 384u);
    var rb0 = fetch_b(b0, col0, 0u, lid);
    var rb1 = fetch_b(b0, col0, 0u, lid + 128u);
    var rb2 = fetch_b(b0, col0, 0u, lid + 256u);
    var rb3 = fetch_b(b0, col0, 0u, lid + 384u);
    put_a(0u, lid, ra0);
    put_a(0u, lid + 128u, ra1);
    put_a(0u, lid + 256u, ra2);
    put_a(0u, lid + 384u, ra3);
    put_b(0u, lid, rb0);
    put_b(0u, lid + 128u, rb1);
    put_b(0u, lid + 256u, rb2);
    put_b(0u, lid + 384u, rb3);
    workgroupBarrier();
    var s = 0u;
    for (var kt = 0u; kt < p.k; kt += TK) {
        let next = kt + TK;
        let more = next < p.k;
        if more {
            ra0 = fetch_a(a0, row0, next, lid);
            ra1 = fetch_a(a0, row0, next, lid + 128u);
            ra2 = fetch_a(a0, row0, next, lid + 256u);
            ra3 = fetch_a(a0, row0, next, lid + 384u);
            rb0 = fetch_b(b0, col0, next, lid);
            rb1 = fetch_b(b0, col0, next, lid + 128u);
            rb2 = fetch_b(b0, col0, next, lid + 256u);
            rb3 = fetch_b(b0, col0, next, lid + 384u);
        }
        for (var ks = 0u; ks < TK; ks += 16u) {
            let fa0 = frag_a(s, wr, ks);
            let fa1 = frag_a(s, wr + 16u, ks);
            let fa2 = frag_a(s, wr + 32u, ks);
            let fa3 = frag_a(s, wr + 48u, ks);
            let fb0 = frag_b(s, wc, ks);
            let fb1 = frag_b(s, wc + 16u, ks);
            let fb2 = frag_b(s, wc + 32u, ks);
            let fb3 = frag_b(s, wc + 48u, ks);
            c0 = coopMultiplyAdd(fa0, fb0, c0);
            c1 = coopMultiplyAdd(fa0, fb1, c1);
            c2 = coopMultiplyAdd(fa0, fb2, c2);
            c3 = coopMultiplyAdd(fa0, fb3, c3);
            c4 = coopMultiplyAdd(fa1, fb0, c4);
            c5 = coopMultiplyAdd(fa1, fb1, c5);
            c6 = coopMultiplyAdd(fa1, fb2, c6);
            c7 = coopMultiplyAdd(fa1, fb3, c7);
            c8 = coopMultiplyAdd(fa2, fb0, c8);
            c9 = coopMultiplyAdd(fa2, fb1, c9);
            c10 = coopMultiplyAdd(fa2, fb2, c10);
            c11 = coopMultiplyAdd(fa2, fb3, c11);
            c12 = coopMultiplyAdd(fa3, fb0, c12);
            c13 = coopMultiplyAdd(fa3, fb1, c13);
            c14 = coopMultiplyAdd(fa3, fb2, c14);
            c15 = coopMultiplyAdd(fa3, fb3, c15);
        }
        s = STAGE - s;
        if more {
            put_a(s, lid, ra0);
            put_a(s, lid + 128u, ra1);
            put_a(s, lid + 256u, ra2);
            put_a(s, lid + 384u, ra3);
            put_b(s, lid, rb0);
            put_b(s, lid + 128u, rb1);
            put_b(s, lid + 256u, rb2);
            put_b(s, lid + 384u, rb3);
        }
        workgroupBarrier();
    }
    let out0 = z * p.m * p.n;
    let r = row0 + wr;
    let c = col0 + wc;
    let own = vec2<u32>(0u);
    store_frag(c0, sg, lane, out0, r, c, own);
    store_frag(c1, sg, lane, out0, r, c + 16u, own);
    store_frag(c2, sg, lane, out0, r, c + 32u, own);
    store_frag(c3, sg, lane, out0, r, c + 48u, own);
    store_frag(c4, sg, lane, out0, r + 16u, c, own);
    store_frag(c5, sg, lane, out0, r + 16u, c + 16u, own);
    store_frag(c6, sg, lane, out0, r + 16u, c + 32u, own);
    store_frag(c7, sg, lane, out0, r + 16u, c + 48u, own);
    store_frag(c8, sg, lane, out0, r + 32u, c, own);
    store_frag(c9, sg, lane, out0, r + 32u, c + 16u, own);
    store_frag(c10, sg, lane, out0, r + 32u, c + 32u, own);
    store_frag(c11, sg, lane, out0, r + 32u, c + 48u, own);
    store_frag(c12, sg, lane, out0, r + 48u, c, own);
    store_frag(c13, sg, lane, out0, r + 48u, c + 16u, own);
    store_frag(c14, sg, lane, out0, r + 48u, c + 32u, own);
    store_frag(c15, sg, lane, out0, r + 48u, c + 48u, own);
}
