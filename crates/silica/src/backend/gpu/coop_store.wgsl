// coop_store.wgsl — how the cooperative-matrix matmul kernels write an
// f32 accumulator fragment (FRAG x FRAG, from the fragment file) to dst
// (the kernel declares `scratch`, FRAG * FRAG f32 per subgroup, and `dst`):
// through the subgroup's scratch, element by element, so that partial
// tiles and 16-bit outputs are written as by the other matmul kernels.

// Writes the elements of fragment `acc` (rows r0.., columns c0.. of this
// batch's dst) at or after row own.x and column own.y, through the subgroup's
// scratch; every thread of the workgroup calls it.
fn store_frag(acc: FragC, sg: u32, lane: u32, out0: u32, r0: u32, c0: u32, own: vec2<u32>) {
    let at = sg * FRAG * FRAG;
    coopStoreT(acc, &scratch[at], FRAG);
    workgroupBarrier();
    // the lanes take the fragment's pairs of elements in turn: each write
    // covers whole rows (FRAG / 2 lanes a row) and reads consecutive words
    // of the scratch (lanes a row apart read the same banks otherwise)
    for (var t = lane; t < FRAG * FRAG / 2u; t += 32u) {
        let i = 2u * t;
        let r = r0 + i / FRAG;
        let c = c0 + i % FRAG;
        if r >= own.x && r < p.m {
            let e = out0 + r * p.n + c;
            let v0 = scratch[at + i];
            let v1 = scratch[at + i + 1u];
            // c is even, and so is own.y where the clamped origin shifted
            // columns (N - 64 is even whenever pairs are written)
            if OUT_DT == 1u {
                if c >= own.y && c < p.n {
                    dst[e >> 1u] = encode_pair(v0, v1, 1u);
                }
            } else {
                if c >= own.y && c < p.n {
                    dst[e] = bitcast<u32>(v0);
                }
                if c + 1u >= own.y && c + 1u < p.n {
                    dst[e + 1u] = bitcast<u32>(v1);
                }
            }
        }
    }
    workgroupBarrier();
}
