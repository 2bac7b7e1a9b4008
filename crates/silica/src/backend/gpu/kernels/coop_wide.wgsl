// coop_wide.wgsl — the loop of the wide cooperative-matrix matmul
// (matmul_coop_vec.wgsl's operands and fetches): dst[z] = a[z] @ b[z] for
// f16 operands, f32 accumulation. A workgroup of 8 subgroups of 32
// computes a 128x256 tile of dst, each subgroup a 64x64 block of 4x4
// fragments of 16x16. Per step of 32 along k the workgroup copies a
// 128x32 slice of a and a 32x256 slice of b into workgroup memory, as runs
// of 8 halves, and each subgroup loads its fragments from there.
//
// Why wider than coop_tiles.wgsl's 128x128: the loads from memory set the
// pace, and a 128x256 tile reads 3/4 of the bytes per product that a
// 128x128 tile does. The 16 accumulators take most of a thread's
// registers, so one workgroup runs per SM, and each barrier stops every
// warp of it. There is room for one stage of tiles only (two would need
// 60 KB), so the runs are fetched into registers two steps ahead of their
// products (two register sets, two steps a round, as in coop_tiles.wgsl;
// issued before the barrier that follows the stores of the last ones) and
// each step has two barriers. dst is written by whole fragment rows
// (coop_store.wgsl), every fragment taken into registers before the first
// write. The time above what the loop takes without loads from memory is
// the loads themselves: the conversions of the runs (halves8.wgsl) cost
// nothing measurable, and smaller tiles with two workgroups an SM are
// slower (docs/tuning.md, "Cooperative-matrix tile shapes").
//
// Workgroups take the tiles in coop_frags.wgsl's order (`tile_origin`).
// The launcher picks this kernel where such tiles are enough to fill a
// large GPU (see matmul.rs).

// 1: b's tile is n-major like a's (k contiguous); 2: k-major.
override B_MODE: u32 = 1u;

const TK: u32 = 32u;
// Columns of the tile (matmul_coop_vec.wgsl's fetches of b read them).
const TN: u32 = 256u;
// Row pitches in vec4<f16> slots, as in coop_tiles.wgsl: 40 halves for the
// n-major tiles, TN + 8 halves for the k-major b tile.
const PK: u32 = 10u;
const PN: u32 = TN / 4u + 2u;

// One stage each: 10,240 and 20,480 bytes, and the scratch of the store:
// 38,912 bytes in all, every variable a multiple of 16 bytes.
var<workgroup> tile_a: array<vec4<f16>, 128u * PK>;
var<workgroup> tile_b: array<vec4<f16>, max(TN * PK, TK * PN)>;
var<workgroup> scratch: array<f32, 2048>; // [8 subgroups][16 * 16]

// One step's runs of a (512: two a thread) and b (1,024: four a thread).
struct Runs {
    a0: mat2x4<f16>,
    a1: mat2x4<f16>,
    b0: mat2x4<f16>,
    b1: mat2x4<f16>,
    b2: mat2x4<f16>,
    b3: mat2x4<f16>,
}

fn fetch_runs(a0: u32, b0: u32, row0: u32, col0: u32, kt: u32, lid: u32) -> Runs {
    return Runs(
        fetch_a(a0, row0, kt, lid),
        fetch_a(a0, row0, kt, lid + 256u),
        fetch_b(b0, col0, kt, lid),
        fetch_b(b0, col0, kt, lid + 256u),
        fetch_b(b0, col0, kt, lid + 512u),
        fetch_b(b0, col0, kt, lid + 768u),
    );
}

fn put_runs(lid: u32, r: Runs) {
    put_a(0u, lid, r.a0);
    put_a(0u, lid + 256u, r.a1);
    put_b(0u, lid, r.b0);
    put_b(0u, lid + 256u, r.b1);
    put_b(0u, lid + 512u, r.b2);
    put_b(0u, lid + 768u, r.b3);
}

// One step's products: the subgroup's 4x4 accumulators (rows wr.., columns
// wc.. of the tile, row by row) plus its fragments of the tiles.
fn products(wr: u32, wc: u32, c0: ptr<function, FragC>, c1: ptr<function, FragC>, c2: ptr<function, FragC>, c3: ptr<function, FragC>, c4: ptr<function, FragC>, c5: ptr<function, FragC>, c6: ptr<function, FragC>, c7: ptr<function, FragC>, c8: ptr<function, FragC>, c9: ptr<function, FragC>, c10: ptr<function, FragC>, c11: ptr<function, FragC>, c12: ptr<function, FragC>, c13: ptr<function, FragC>, c14: ptr<function, FragC>, c15: ptr<function, FragC>) {
    for (var ks = 0u; ks < TK; ks += 16u) {
        let fa0 = frag_a(0u, wr, ks);
        let fa1 = frag_a(0u, wr + 16u, ks);
        let fa2 = frag_a(0u, wr + 32u, ks);
        let fa3 = frag_a(0u, wr + 48u, ks);
        let fb0 = frag_b(0u, wc, ks);
        let fb1 = frag_b(0u, wc + 16u, ks);
        let fb2 = frag_b(0u, wc + 32u, ks);
        let fb3 = frag_b(0u, wc + 48u, ks);
        *c0 = coopMultiplyAdd(fa0, fb0, *c0);
        *c1 = coopMultiplyAdd(fa0, fb1, *c1);
        *c2 = coopMultiplyAdd(fa0, fb2, *c2);
        *c3 = coopMultiplyAdd(fa0, fb3, *c3);
        *c4 = coopMultiplyAdd(fa1, fb0, *c4);
        *c5 = coopMultiplyAdd(fa1, fb1, *c5);
        *c6 = coopMultiplyAdd(fa1, fb2, *c6);
        *c7 = coopMultiplyAdd(fa1, fb3, *c7);
        *c8 = coopMultiplyAdd(fa2, fb0, *c8);
        *c9 = coopMultiplyAdd(fa2, fb1, *c9);
        *c10 = coopMultiplyAdd(fa2, fb2, *c10);
        *c11 = coopMultiplyAdd(fa2, fb3, *c11);
        *c12 = coopMultiplyAdd(fa3, fb0, *c12);
        *c13 = coopMultiplyAdd(fa3, fb1, *c13);
        *c14 = coopMultiplyAdd(fa3, fb2, *c14);
        *c15 = coopMultiplyAdd(fa3, fb3, *c15);
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
    let origin0 = tile_origin(wid.xy, nwg.xy);
    let row0 = origin0.x;
    let col0 = origin0.y;
    let wr = (sg / 4u) * 64u;
    let wc = (sg % 4u) * 64u;
    var c0 = FragC();
    var c1 = FragC();
    var c2 = FragC();
    var c3 = FragC();
    var c4 = FragC();
    var c5 = FragC();
    var c6 = FragC();
    var c7 = FragC();
    var c8 = FragC();
    var c9 = FragC();
    var c10 = FragC();
    var c11 = FragC();
    var c12 = FragC();
    var c13 = FragC();
    var c14 = FragC();
    var c15 = FragC();
    // r and q: the two register sets, steps kt and kt + TK at the top of a
    // round; past K the fetches give zeros, so an odd count of steps ends
    // with a step of zero tiles
    var r = fetch_runs(a0, b0, row0, col0, 0u, lid);
    var q = fetch_runs(a0, b0, row0, col0, TK, lid);
    for (var kt = 0u; kt < p.k; kt += 2u * TK) {
        put_runs(lid, r);
        r = fetch_runs(a0, b0, row0, col0, kt + 2u * TK, lid);
        workgroupBarrier();
        products(wr, wc, &c0, &c1, &c2, &c3, &c4, &c5, &c6, &c7, &c8, &c9, &c10, &c11, &c12, &c13, &c14, &c15);
        workgroupBarrier();
        put_runs(lid, q);
        q = fetch_runs(a0, b0, row0, col0, kt + 3u * TK, lid);
        workgroupBarrier();
        products(wr, wc, &c0, &c1, &c2, &c3, &c4, &c5, &c6, &c7, &c8, &c9, &c10, &c11, &c12, &c13, &c14, &c15);
        workgroupBarrier();
    }
    let out0 = z * p.m * p.n;
    let r0 = row0 + wr;
    let own = vec2<u32>(0u);
    // every fragment into registers, then the writes (see coop_store.wgsl)
    let v0 = frag_pairs(c0, sg, lane);
    let v1 = frag_pairs(c1, sg, lane);
    let v2 = frag_pairs(c2, sg, lane);
    let v3 = frag_pairs(c3, sg, lane);
    let v4 = frag_pairs(c4, sg, lane);
    let v5 = frag_pairs(c5, sg, lane);
    let v6 = frag_pairs(c6, sg, lane);
    let v7 = frag_pairs(c7, sg, lane);
    let v8 = frag_pairs(c8, sg, lane);
    let v9 = frag_pairs(c9, sg, lane);
    let v10 = frag_pairs(c10, sg, lane);
    let v11 = frag_pairs(c11, sg, lane);
    let v12 = frag_pairs(c12, sg, lane);
    let v13 = frag_pairs(c13, sg, lane);
    let v14 = frag_pairs(c14, sg, lane);
    let v15 = frag_pairs(c15, sg, lane);
    write_pairs(v0, lane, out0, r0, col0 + wc, own);
    write_pairs(v1, lane, out0, r0, col0 + wc + 16u, own);
    write_pairs(v2, lane, out0, r0, col0 + wc + 32u, own);
    write_pairs(v3, lane, out0, r0, col0 + wc + 48u, own);
    write_pairs(v4, lane, out0, r0 + 16u, col0 + wc, own);
    write_pairs(v5, lane, out0, r0 + 16u, col0 + wc + 16u, own);
    write_pairs(v6, lane, out0, r0 + 16u, col0 + wc + 32u, own);
    write_pairs(v7, lane, out0, r0 + 16u, col0 + wc + 48u, own);
    write_pairs(v8, lane, out0, r0 + 32u, col0 + wc, own);
    write_pairs(v9, lane, out0, r0 + 32u, col0 + wc + 16u, own);
    write_pairs(v10, lane, out0, r0 + 32u, col0 + wc + 32u, own);
    write_pairs(v11, lane, out0, r0 + 32u, col0 + wc + 48u, own);
    write_pairs(v12, lane, out0, r0 + 48u, col0 + wc, own);
    write_pairs(v13, lane, out0, r0 + 48u, col0 + wc + 16u, own);
    write_pairs(v14, lane, out0, r0 + 48u, col0 + wc + 32u, own);
    write_pairs(v15, lane, out0, r0 + 48u, col0 + wc + 48u, own);
}
