// matmul_narrow.wgsl — dst = x @ wᵀ for up to 32 rows of f16 x (a short
// prompt, a server's step of many sequences) and f16 weights w [N, K]
// stored with K contiguous, on cooperative matrices: qmatmul_narrow.wgsl's
// arrangement with the weights' halves copied as they are. Each subgroup
// owns 16 weight rows and walks the workgroup's part of K on its own, in
// steps of 128: its lanes load the step's 16 rows with 16-byte loads of
// consecutive words (16 lanes a row), put them into the subgroup's f16
// tile and multiply, the next step's loads issued before this step's
// tile is written. Subgroup barriers separate the phases; no workgroup
// barrier couples the subgroups inside the loop, so a workgroup's loads
// stay in flight while another subgroup multiplies.
//
// The part's slice of x (MF fragments of 16 rows, zeros past M and past
// the part's end) is copied into workgroup memory once. Each part's
// product, f32, goes to dst at z * 16 MF * pitch, rows padded to whole
// fragments and columns to the pitch (64 times the grid's workgroups
// along x and y); split_sum.wgsl adds the parts. K, both row strides and
// both offsets are multiples of 8 (the launcher checks them).

struct NarrowParams {
    m: u32,
    n: u32,
    k: u32,
    // elements between rows of x and of w
    ldx: u32,
    ldw: u32,
    off_x: u32,
    off_w: u32,
    pitch: u32,
}

@group(0) @binding(0) var<uniform> p: NarrowParams;
@group(0) @binding(1) var<storage, read> src_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;

// Fragments of 16 rows of x, 1 or 2.
override MF: u32 = 1u;
// The most of K a part walks (a multiple of 128): MF 16 (KA / 4 + 2) vec4
// slots of x must fit tile_x.
override KA: u32 = 512u;

// K per step.
const TK: u32 = 128u;
// Row pitch of the weight tiles in vec4<f16> slots: 136 halves, 272 bytes
// (a multiple of 16, as fragment loads need on NVIDIA).
const PB: u32 = TK / 4u + 2u;
// One f16 tile: 16 weight rows.
const STAGE: u32 = 16u * PB;
// 16-byte words a lane loads a step: 16 rows of 16 words over 32 lanes.
const WL: u32 = 8u;

// x's slice, [16 MF][KA + 8] halves; f16 weight tiles, one a subgroup.
var<workgroup> tile_x: array<vec4<f16>, 2112>;
var<workgroup> tile_w: array<vec4<f16>, 4u * STAGE>;

const ZERO8 = mat2x4<f16>(vec4<f16>(0.0h), vec4<f16>(0.0h));

// Part z of nz of K: whole steps of TK, the last part what is left.
fn k_range(z: u32, nz: u32) -> vec2<u32> {
    let part = (p.k / TK + select(0u, 1u, p.k % TK != 0u) + nz - 1u) / nz * TK;
    return vec2<u32>(min(z * part, p.k), min((z + 1u) * part, p.k));
}

// The words this lane loads of the step at element `kt` (word u = lane +
// 32 j is word u % 16 of row u / 16): rows clamped to the last, zeros from
// `stop` on.
fn fetch(n0: u32, kt: u32, stop: u32, lane: u32) -> array<vec4<u32>, WL> {
    var v: array<vec4<u32>, WL>;
    for (var j = 0u; j < WL; j++) {
        let u = lane + 32u * j;
        let row = min(n0 + u / 16u, p.n - 1u);
        let k = kt + (u % 16u) * 8u;
        if k < stop {
            v[j] = src_w[(p.off_w + row * p.ldw + k) >> 3u];
        }
    }
    return v;
}

// Writes a lane's words into subgroup tile `t` (n-major, k contiguous).
fn put(t: u32, lane: u32, v: array<vec4<u32>, WL>) {
    for (var j = 0u; j < WL; j++) {
        let u = lane + 32u * j;
        let h = halves8(v[j]);
        let at = t + (u / 16u) * PB + (u % 16u) * 2u;
        tile_w[at] = h[0];
        tile_w[at + 1u] = h[1];
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
    var cur = fetch(n0, kr.x, kr.y, lane);

    // x's slice: runs of 8 halves, zeros past M and past the part's end
    let per_row = steps * (TK / 8u);
    let runs = MF * 16u * per_row;
    for (var u = lid; u < runs; u += 128u) {
        let r = u / per_row;
        let c = u % per_row;
        let k = kr.x + c * 8u;
        var v = ZERO8;
        if r < p.m && k < kr.y {
            v = halves8(src_x[(p.off_x + r * p.ldx + k) >> 3u]);
        }
        let t = r * px + c * 2u;
        tile_x[t] = v[0];
        tile_x[t + 1u] = v[1];
    }
    workgroupBarrier();

    let t = sg * STAGE;
    var c0 = FragC();
    var c1 = FragC();
    for (var i = 0u; i < steps; i++) {
        let kt = kr.x + i * TK;
        let next = fetch(n0, kt + TK, kr.y, lane);
        put(t, lane, cur);
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
        // the next step's tile waits for every lane's loads of this one
        subgroupBarrier();
        cur = next;
    }
    // (the stride a named value too, for the same reason)
    let np = p.pitch;
    let out0 = wid.z * MF * 16u * np + n0;
    coopStoreT(c0, &dst[out0], np);
    if MF > 1u {
        let o1 = out0 + 16u * np;
        coopStoreT(c1, &dst[o1], np);
    }
}
