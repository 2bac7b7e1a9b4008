// coop_store.wgsl — how the cooperative-matrix matmul kernels write an
// f32 accumulator fragment (FRAG x FRAG, from the fragment file) to dst
// (the kernel declares `scratch`, FRAG * FRAG f32 per subgroup, and `dst`):
// through the subgroup's scratch, element by element, so that partial
// tiles and 16-bit outputs are written as by the other matmul kernels.
//
// The lanes take the fragment's pairs of elements in turn (pair lane + 32 j
// is elements 2 (lane + 32 j) and the next, row-major): each write covers
// whole rows (FRAG / 2 lanes a row) and the lanes read consecutive words of
// the scratch (lanes a row apart read the same banks otherwise). The pairs
// are taken into registers first and written after the barrier that frees
// the scratch, so that no store to dst waits at a barrier; coop_wide.wgsl
// takes all its fragments' pairs before it writes any.
//
// 16-bit outputs are packed by the hardware (pack2x16float), not by
// common.wgsl's integer f32_to_f16: these kernels run only where the
// adapter has cooperative matrices (NVIDIA through Vulkan, Apple through
// Metal), whose conversions round to nearest even, keep subnormals and
// overflow to infinity, as the integer form does. The integer form's ~12
// operations a value are a visible part of a large product's store, with
// nothing else running on the SM (docs/tuning.md, "16-bit outputs of the
// cooperative-matrix store").

// Pairs of a fragment that each lane writes.
const PAIRS: u32 = FRAG * FRAG / 64u;

// This lane's pairs of fragment `acc`, through the subgroup's scratch; every
// thread of the workgroup calls it.
fn frag_pairs(acc: FragC, sg: u32, lane: u32) -> array<vec2<f32>, PAIRS> {
    let at = sg * FRAG * FRAG;
    coopStoreT(acc, &scratch[at], FRAG);
    workgroupBarrier();
    var v: array<vec2<f32>, PAIRS>;
    for (var j = 0u; j < PAIRS; j++) {
        let i = 2u * (lane + 32u * j);
        v[j] = vec2<f32>(scratch[at + i], scratch[at + i + 1u]);
    }
    workgroupBarrier();
    return v;
}

// Writes this lane's pairs `v` of a fragment at rows r0.., columns c0.. of
// this batch's dst, those at or after row own.x and column own.y.
fn write_pairs(v: array<vec2<f32>, PAIRS>, lane: u32, out0: u32, r0: u32, c0: u32, own: vec2<u32>) {
    for (var j = 0u; j < PAIRS; j++) {
        let i = 2u * (lane + 32u * j);
        let r = r0 + i / FRAG;
        let c = c0 + i % FRAG;
        if r >= own.x && r < p.m {
            let e = out0 + r * p.n + c;
            // c is even, and so is own.y where the clamped origin shifted
            // columns (N - 64 is even whenever pairs are written)
            if OUT_DT == 1u {
                if c >= own.y && c < p.n {
                    let w = e >> 1u;
                    dst[w >> 2u][w & 3u] = pack2x16float(v[j]);
                }
            } else {
                if c >= own.y && c < p.n {
                    dst[e >> 2u][e & 3u] = bitcast<u32>(v[j].x);
                }
                if c + 1u >= own.y && c + 1u < p.n {
                    dst[(e + 1u) >> 2u][(e + 1u) & 3u] = bitcast<u32>(v[j].y);
                }
            }
        }
    }
}

// Writes the elements of fragment `acc` (rows r0.., columns c0.. of this
// batch's dst) at or after row own.x and column own.y; every thread of the
// workgroup calls it.
fn store_frag(acc: FragC, sg: u32, lane: u32, out0: u32, r0: u32, c0: u32, own: vec2<u32>) {
    write_pairs(frag_pairs(acc, sg, lane), lane, out0, r0, c0, own);
}
