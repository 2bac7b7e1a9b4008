// matmul_coop_direct.wgsl — dst[z] = a[z] @ b[z] for f16 operands on
// cooperative matrices, fragments loaded straight from the operands'
// buffers (no workgroup staging: the L1 cache serves the reuse between
// subgroups). A workgroup of 4 subgroups of 32 computes a 128x128 tile of
// dst; each subgroup a 64x64 block, 4x4 fragments of 16x16 with f32
// accumulation. Faster than matmul_coop.wgsl where the grid fills the GPU
// (no conversion of every half through a store to workgroup memory), slower
// on small grids (half the threads per tile).
//
// Fragments are read whole, so the launcher guarantees what a read needs:
// M, N >= 64, K a multiple of 16, a contiguous along k (A_VEC) and b along
// k (B_MODE 1) or along n (B_MODE 2, N a multiple of 8), every row start a
// multiple of 8 halves. A subgroup whose block crosses the bottom or right
// edge computes the last 64 rows or columns instead (its origin clamped to
// M - 64, N - 64; B_MODE 2 keeps 16-byte alignment since N is a multiple
// of 8) and writes only the part of them that is its own.
// Params from matmul_common.wgsl.

@group(0) @binding(1) var<storage, read> src_a: array<f16>;
@group(0) @binding(2) var<storage, read> src_b: array<f16>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override OUT_DT: u32 = 0u;
override A_VEC: bool = true;
override B_MODE: u32 = 1u;

var<workgroup> scratch: array<f32, 1024>; // [4 subgroups][16 * 16]

// The fragment of a whose top-left element is at `at`.
fn frag_a(at: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&src_a[at], p.sa_m);
}

// The fragment of b at rows k.., columns c..
fn frag_b(b0: u32, k: u32, c: u32) -> coop_mat16x16<f16, B> {
    if B_MODE == 1u {
        // column-major: element (k, n) at n * sb_n + k
        let at = b0 + c * p.sb_n + k;
        return coopLoad<coop_mat16x16<f16, B>>(&src_b[at], p.sb_n);
    }
    let at = b0 + k * p.sb_k + c;
    return coopLoadT<coop_mat16x16<f16, B>>(&src_b[at], p.sb_k);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z;
    let a0 = p.off_a + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_a);
    let b0 = p.off_b + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_b);
    let sg = lid / 32u;
    let lane = lid % 32u;
    // this subgroup's own block, and the block it computes
    let own = vec2<u32>(wid.y * 128u + (sg / 2u) * 64u, wid.x * 128u + (sg % 2u) * 64u);
    let wr = min(own.x, p.m - 64u);
    let wc = min(own.y, p.n - 64u);
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
    let ar = a0 + wr * p.sa_m;
    let a16 = 16u * p.sa_m;
    for (var k = 0u; k < p.k; k += 16u) {
        let x0 = ar + k;
        let x1 = x0 + a16;
        let x2 = x1 + a16;
        let x3 = x2 + a16;
        let fa0 = frag_a(x0);
        let fa1 = frag_a(x1);
        let fa2 = frag_a(x2);
        let fa3 = frag_a(x3);
        let fb0 = frag_b(b0, k, wc);
        let fb1 = frag_b(b0, k, wc + 16u);
        let fb2 = frag_b(b0, k, wc + 32u);
        let fb3 = frag_b(b0, k, wc + 48u);
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
    let out0 = z * p.m * p.n;
    store_frag(c0, sg, lane, out0, wr, wc, own);
    store_frag(c1, sg, lane, out0, wr, wc + 16u, own);
    store_frag(c2, sg, lane, out0, wr, wc + 32u, own);
    store_frag(c3, sg, lane, out0, wr, wc + 48u, own);
    store_frag(c4, sg, lane, out0, wr + 16u, wc, own);
    store_frag(c5, sg, lane, out0, wr + 16u, wc + 16u, own);
    store_frag(c6, sg, lane, out0, wr + 16u, wc + 32u, own);
    store_frag(c7, sg, lane, out0, wr + 16u, wc + 48u, own);
    store_frag(c8, sg, lane, out0, wr + 32u, wc, own);
    store_frag(c9, sg, lane, out0, wr + 32u, wc + 16u, own);
    store_frag(c10, sg, lane, out0, wr + 32u, wc + 32u, own);
    store_frag(c11, sg, lane, out0, wr + 32u, wc + 48u, own);
    store_frag(c12, sg, lane, out0, wr + 48u, wc, own);
    store_frag(c13, sg, lane, out0, wr + 48u, wc + 16u, own);
    store_frag(c14, sg, lane, out0, wr + 48u, wc + 32u, own);
    store_frag(c15, sg, lane, out0, wr + 48u, wc + 48u, own);
}
