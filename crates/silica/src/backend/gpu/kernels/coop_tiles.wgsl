// coop_tiles.wgsl — the loop of the tiled cooperative-matrix kernels
// (matmul_coop_vec.wgsl, qmatmul_coop.wgsl): dst[z] = a[z] @ b[z] for f16
// operands, f32 accumulation. A workgroup of 8 subgroups of 32 computes a
// 128x128 tile of dst, each subgroup a 32x64 block of 2x4 fragments of
// 16x16. Per step of 32 along k the workgroup copies a 128x32 slice of a
// and a 32x128 slice of b into workgroup memory, as runs of 8 halves, and
// each subgroup loads its fragments from there. The tiles are
// double-buffered, and the runs are fetched into registers two steps
// ahead of their products: while step t's products run, step t + 1's runs
// (fetched during step t - 1) wait in registers and step t + 2's are in
// flight. The loop takes two steps a round, one register set each, so
// that no fetched run is copied between registers (a copy would wait for
// its load). One barrier a step.
//
// The loads from memory set the pace: the products, the fragment loads
// and the barriers alone run at about twice the rate of the whole kernel.
// Hence 8 subgroups (more warps with loads in flight), the fetch two
// steps ahead, the tiles' order below and 16-byte loads (halves8.wgsl)
// (docs/tuning.md, "Cooperative-matrix tile shapes").
//
// Workgroups take the tiles in bands of 8 tile rows, column by column
// within a band, so that those running together share their slices of a
// and b in the L2 cache (coop_frags.wgsl's `tile_origin`).
//
// The tiles are typed vec4<f16>: naga gives a cooperative load the scalar
// type of its pointer, so they cannot be words, and a cooperative load
// through a wider (mat2x4) pointer read wrong values on NVIDIA's driver.
// Through SPIR-V a cooperative load's stride counts the pointer's elements
// (vec4<f16> slots: PK, PN). MSL counts halves, so the launchers never
// pick these kernels on Metal (see coop16_available).
//
// Runs go into the tiles and fragments come out of them through
// coop_frags.wgsl. The kernel file provides `origins(z)` (the element offsets of a[z] and
// b[z]), `fetch_a` and `fetch_b` (run g, 0..511, of the step's slices, as
// a mat2x4<f16>; zeros for a step at or past K) and `put_b` (a fetched
// run into stage s of tile_b; a's runs go in by put_a). Rows and columns
// past the edges are fetched clamped to the last ones and not written.
// The store is coop_store.wgsl's. The kernel file's `k_range(z, nz)` gives
// the part of K that grid layer z of nz walks (all of it, or one part of a
// split K whose partial products the launcher sums); its fetches give
// zeros at or past `k_stop`, the range's end.

// 1: b's tile is n-major like a's (k contiguous); 2: k-major.
override B_MODE: u32 = 1u;

const TK: u32 = 32u;
// Columns of the tile (matmul_coop_vec.wgsl's fetches of b read them).
const TN: u32 = 128u;
// Row pitch of the [128][TK] tiles in vec4<f16> slots: 40 halves, 80
// bytes, so that the 8 rows of a fragment load start on distinct banks.
const PK: u32 = 10u;
// Row pitch of the k-major [TK][128] b tile: 136 halves.
const PN: u32 = TN / 4u + 2u;
// vec4 slots per stage: a's [128][PK], or b's, the larger layout.
const STAGE: u32 = max(128u * PK, TK * PN);

// Two stages each; 49,152 bytes in all with the scratch, every variable a
// multiple of 16 bytes (NVIDIA places them back to back, and a fragment
// load from an address that is not a multiple of 16 bytes reads wrongly).
var<workgroup> tile_a: array<vec4<f16>, 2u * STAGE>;
var<workgroup> tile_b: array<vec4<f16>, 2u * STAGE>;
var<workgroup> scratch: array<f32, 2048>; // [8 subgroups][16 * 16]

// The end of the part of K this workgroup walks (k_range).
var<private> k_stop: u32;

// One step's products: the subgroup's 2x4 accumulators (rows wr.., columns
// wc.. of the tile) plus its fragments of stage s.
fn products(s: u32, wr: u32, wc: u32, c0: ptr<function, FragC>, c1: ptr<function, FragC>, c2: ptr<function, FragC>, c3: ptr<function, FragC>, c4: ptr<function, FragC>, c5: ptr<function, FragC>, c6: ptr<function, FragC>, c7: ptr<function, FragC>) {
    for (var ks = 0u; ks < TK; ks += 16u) {
        let fa0 = frag_a(s, wr, ks);
        let fa1 = frag_a(s, wr + 16u, ks);
        let fb0 = frag_b(s, wc, ks);
        let fb1 = frag_b(s, wc + 16u, ks);
        let fb2 = frag_b(s, wc + 32u, ks);
        let fb3 = frag_b(s, wc + 48u, ks);
        *c0 = coopMultiplyAdd(fa0, fb0, *c0);
        *c1 = coopMultiplyAdd(fa0, fb1, *c1);
        *c2 = coopMultiplyAdd(fa0, fb2, *c2);
        *c3 = coopMultiplyAdd(fa0, fb3, *c3);
        *c4 = coopMultiplyAdd(fa1, fb0, *c4);
        *c5 = coopMultiplyAdd(fa1, fb1, *c5);
        *c6 = coopMultiplyAdd(fa1, fb2, *c6);
        *c7 = coopMultiplyAdd(fa1, fb3, *c7);
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z;
    let origin = origins(z);
    let a0 = origin.x;
    let b0 = origin.y;
    let sg = lid / 32u;
    let lane = lid % 32u;
    let kr = k_range(z, nwg.z);
    k_stop = kr.y;
    let origin0 = tile_origin(wid.xy, nwg.xy);
    let row0 = origin0.x;
    let col0 = origin0.y;
    let wr = (sg / 2u) * 32u;
    let wc = (sg % 2u) * 64u;
    var c0 = FragC();
    var c1 = FragC();
    var c2 = FragC();
    var c3 = FragC();
    var c4 = FragC();
    var c5 = FragC();
    var c6 = FragC();
    var c7 = FragC();
    // step 0 into stage 0; ra*/rb* and qa*/qb* are the two register sets
    var ra0 = fetch_a(a0, row0, kr.x, lid);
    var ra1 = fetch_a(a0, row0, kr.x, lid + 256u);
    var rb0 = fetch_b(b0, col0, kr.x, lid);
    var rb1 = fetch_b(b0, col0, kr.x, lid + 256u);
    put_a(0u, lid, ra0);
    put_a(0u, lid + 256u, ra1);
    put_b(0u, lid, rb0);
    put_b(0u, lid + 256u, rb1);
    workgroupBarrier();
    // s: the stage this step's products read
    var s = 0u;
    var qa0 = fetch_a(a0, row0, kr.x + TK, lid);
    var qa1 = fetch_a(a0, row0, kr.x + TK, lid + 256u);
    var qb0 = fetch_b(b0, col0, kr.x + TK, lid);
    var qb1 = fetch_b(b0, col0, kr.x + TK, lid + 256u);
    // two steps a round: past K the fetches give zeros, so an odd count
    // of steps ends with a step of zero tiles
    for (var kt = kr.x; kt < kr.y; kt += 2u * TK) {
        // step kt: q* hold step kt + TK, r* take step kt + 2 TK
        let n2 = kt + 2u * TK;
        ra0 = fetch_a(a0, row0, n2, lid);
        ra1 = fetch_a(a0, row0, n2, lid + 256u);
        rb0 = fetch_b(b0, col0, n2, lid);
        rb1 = fetch_b(b0, col0, n2, lid + 256u);
        products(s, wr, wc, &c0, &c1, &c2, &c3, &c4, &c5, &c6, &c7);
        s = STAGE - s;
        put_a(s, lid, qa0);
        put_a(s, lid + 256u, qa1);
        put_b(s, lid, qb0);
        put_b(s, lid + 256u, qb1);
        workgroupBarrier();
        // step kt + TK: r* hold step kt + 2 TK, q* take step kt + 3 TK
        let n3 = kt + 3u * TK;
        qa0 = fetch_a(a0, row0, n3, lid);
        qa1 = fetch_a(a0, row0, n3, lid + 256u);
        qb0 = fetch_b(b0, col0, n3, lid);
        qb1 = fetch_b(b0, col0, n3, lid + 256u);
        products(s, wr, wc, &c0, &c1, &c2, &c3, &c4, &c5, &c6, &c7);
        s = STAGE - s;
        put_a(s, lid, ra0);
        put_a(s, lid + 256u, ra1);
        put_b(s, lid, rb0);
        put_b(s, lid + 256u, rb1);
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
}
