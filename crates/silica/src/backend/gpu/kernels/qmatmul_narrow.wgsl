// qmatmul_narrow.wgsl — dst = x @ wᵀ for 16 to 32 rows of f16 x (a short
// prompt, a server's step of many sequences), w in one of the formats of
// 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), on cooperative
// matrices. Each subgroup owns 16 weight rows and walks the workgroup's
// part of K on its own, in steps of 128: its lanes copy the step's raw
// blocks of the 16 rows (4 a row) into the subgroup's own workgroup memory
// with loads of consecutive words, decode them from there (each lane two
// blocks of one row, through quant_blocks.wgsl, which reads `src_w`: here
// that copy) into an f16 tile, and multiply. Subgroup barriers separate
// the phases; no workgroup barrier couples the subgroups inside the loop.
// The copy reads consecutive words of a row with consecutive lanes; lanes
// reading their own rows' blocks straight from memory, as the 128-row
// tiles do, took 17-36% longer here (docs/tuning.md, "Narrow products,
// a subgroup a tile").
//
// The part's slice of x (MF fragments of 16 rows, zeros past M and past
// the part's end) is copied into workgroup memory once. Each part's
// product, f32, goes to dst at z * 16 MF * NP, rows padded to whole
// fragments and columns to NP (64 times the workgroups of the grid's x
// and y, `p.eps`' slot carries it); split_sum.wgsl adds the parts. Params
// from qmatmul_common.wgsl; K a multiple of 32 and x contiguous from a
// multiple of 8 elements (the launcher checks both).

@group(0) @binding(0) var<uniform> p: QParams;
@group(0) @binding(1) var<storage, read> src_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_wq: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// Fragments of 16 rows of x, 1 or 2.
override MF: u32 = 1u;
// The most of K a part walks (a multiple of 128): MF 16 (KA / 4 + 2) vec4
// slots of x must fit tile_x.
override KA: u32 = 512u;

// K per step: four blocks of 32.
const TK: u32 = 128u;
// Row pitch of the weight tiles in vec4<f16> slots: 136 halves, 272 bytes
// (a multiple of 16, as fragment loads need on NVIDIA).
const PB: u32 = TK / 4u + 2u;
// One f16 tile: 16 weight rows.
const STAGE: u32 = 16u * PB;
// Words of a row's raw step: 4 blocks (at most 136 bytes) and one more for
// a row that starts 2 bytes into a word.
const RW: u32 = 35u;
// Raw words a lane holds: 16 rows of RW words over 32 lanes.
const RL: u32 = (16u * RW + 31u) / 32u;

// x's slice, [16 MF][KA + 8] halves; f16 weight tiles, one a subgroup.
var<workgroup> tile_x: array<vec4<f16>, 2112>;
var<workgroup> tile_w: array<vec4<f16>, 4u * STAGE>;
// The raw blocks of a step, RW words a row, 16 rows a subgroup: named as
// quant_blocks.wgsl reads the weights.
var<workgroup> src_w: array<u32, 64u * RW>;

const ZERO8 = mat2x4<f16>(vec4<f16>(0.0h), vec4<f16>(0.0h));

// Part z of nz of K: whole steps of TK, the last part what is left.
fn k_range(z: u32, nz: u32) -> vec2<u32> {
    let part = (p.k / TK + select(0u, 1u, p.k % TK != 0u) + nz - 1u) / nz * TK;
    return vec2<u32>(min(z * part, p.k), min((z + 1u) * part, p.k));
}

// Words this lane copies of a step's raw blocks (its share of 16 rows of
// RW words; word u = lane + 32 j is word u % RW of row u / RW), from the
// step at element `kt`; rows clamped to the last, zeros past the part's end
// (`stop`, where the row's blocks end too) or past the matrix.
fn fetch_raw(n0: u32, kt: u32, stop: u32, lane: u32) -> array<u32, RL> {
    var v: array<u32, RL>;
    let bb = block_bytes();
    // the row's words that hold blocks kt / 32 .. + 4, from the word that
    // holds its first byte
    let words = (4u * bb + 2u + 3u) / 4u;
    for (var j = 0u; j < RL; j++) {
        let u = lane + 32u * j;
        let r = u / RW;
        let w = u % RW;
        let row = min(n0 + r, p.n - 1u);
        let start = row * p.row_bytes + (kt / 32u) * bb;
        let end = row * p.row_bytes + min(kt + TK, stop) / 32u * bb;
        let at = start / 4u + w;
        if r < 16u && w < words && kt < stop && at * 4u < end {
            v[j] = src_wq[at];
        }
    }
    return v;
}

// Stores a lane's raw words into the subgroup's rows of src_w.
fn put_raw(sg: u32, lane: u32, v: array<u32, RL>) {
    for (var j = 0u; j < RL; j++) {
        let u = lane + 32u * j;
        if u < 16u * RW {
            src_w[sg * 16u * RW + u] = v[j];
        }
    }
}

// Part q of the block at byte `base` of src_w, decoded, in f16.
fn part8(base: u32, q: u32, s: vec4<f32>) -> mat2x4<f16> {
    let v = part_values(base, 0u, q, s);
    return mat2x4<f16>(vec4<f16>(v[0]), vec4<f16>(v[1]));
}

// Decodes block `b` (0..3) of tile row `r` of subgroup sg's raw step into
// its f16 tile at slot `t` (n-major, k contiguous); zeros past `stop`.
fn decode_block(sg: u32, t: u32, r: u32, b: u32, row: u32, kt: u32, stop: u32) {
    let at = t + r * PB + b * 8u;
    if kt + 32u * b >= stop {
        for (var i = 0u; i < 8u; i++) {
            tile_w[at + i] = vec4<f16>(0.0h);
        }
        return;
    }
    let shift = (row * p.row_bytes + (kt / 32u) * block_bytes()) % 4u;
    let base = (sg * 16u + r) * RW * 4u + shift + b * block_bytes();
    let s = group_scale(base, 0u);
    for (var q = 0u; q < 4u; q++) {
        let v = part8(base, q, s);
        let ko = part_k(q);
        tile_w[at + ko.x / 4u] = v[0];
        tile_w[at + ko.y / 4u] = v[1];
    }
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let sg = lid / 32u;
    let lane = lid % 32u;
    let kr = k_range(wid.z, nwg.z);
    let steps = (kr.y - kr.x + TK - 1u) / TK;
    let px = KA / 4u + 2u;

    // (the pitch covers every workgroup's columns, so that the subgroups
    // past N, on clamped rows, stay in step with the others: cooperative
    // operations need uniform control flow)
    let n0 = (wid.y * nwg.x + wid.x) * 64u + sg * 16u;
    // the first step's weights are loaded while x's slice is copied
    var cur = fetch_raw(n0, kr.x, kr.y, lane);

    // x's slice: runs of 8 halves, zeros past M and past the part's end
    let per_row = steps * (TK / 8u);
    let runs = MF * 16u * per_row;
    for (var u = lid; u < runs; u += 128u) {
        let r = u / per_row;
        let c = u % per_row;
        let k = kr.x + c * 8u;
        var v = ZERO8;
        if r < p.m && k < kr.y {
            v = halves8(src_x[(p.off_x + r * p.k + k) >> 3u]);
        }
        let t = r * px + c * 2u;
        tile_x[t] = v[0];
        tile_x[t + 1u] = v[1];
    }
    workgroupBarrier();

    let r = lane / 2u;
    let row = min(n0 + r, p.n - 1u);
    let t = sg * STAGE;
    var c0 = FragC();
    var c1 = FragC();
    for (var i = 0u; i < steps; i++) {
        let kt = kr.x + i * TK;
        let next = fetch_raw(n0, kt + TK, kr.y, lane);
        put_raw(sg, lane, cur);
        subgroupBarrier();
        decode_block(sg, t, r, 2u * (lane % 2u), row, kt, kr.y);
        decode_block(sg, t, r, 2u * (lane % 2u) + 1u, row, kt, kr.y);
        subgroupBarrier();
        for (var ks = 0u; ks < TK; ks += 16u) {
            // (each pointer's index a named value: naga's SPIR-V writer
            // fails on an index computed inside a cooperative load)
            let bt = t + ks / 4u;
            let fb = coopLoad<FragB>(&tile_w[bt], PB);
            let a0 = (i * TK + ks) / 4u;
            c0 = coopMultiplyAdd(coopLoadT<FragA>(&tile_x[a0], px), fb, c0);
            if MF > 1u {
                let a1 = 16u * px + a0;
                c1 = coopMultiplyAdd(coopLoadT<FragA>(&tile_x[a1], px), fb, c1);
            }
        }
        // the next step's raw words and tile wait for every lane's loads
        // of this one
        subgroupBarrier();
        cur = next;
    }
    let np = p.eps;
    let out0 = wid.z * MF * 16u * np + n0;
    coopStoreT(c0, &dst[out0], np);
    if MF > 1u {
        let o1 = out0 + 16u * np;
        coopStoreT(c1, &dst[o1], np);
    }
}
