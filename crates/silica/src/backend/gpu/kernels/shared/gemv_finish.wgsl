// gemv_finish.wgsl — the end the GEMV kernels (plain and quantized) share:
// the LANES partial sums of each of the M rows of a column joined by a tree
// sum in workgroup memory, and lane 0 writing the column's M outputs from
// element out0 on. Needs `p.n`, `dst: array<u32>`, `OUT_DT`, `M` and
// `LANES`; called by every thread of the workgroup.

var<workgroup> partial: array<f32, 2048>; // [MAX_M = 8][256]

fn gemv_finish(acc: array<f32, 8>, lid: u32, col: u32, out0: u32) {
    let lane = lid % LANES;
    for (var r = 0u; r < M; r++) {
        partial[r * WG + lid] = acc[r];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if lane < s {
            for (var r = 0u; r < M; r++) {
                partial[r * WG + lid] += partial[r * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
    if lane != 0u || col >= p.n {
        return;
    }
    for (var r = 0u; r < M; r++) {
        let e = out0 + r * p.n + col;
        let v = partial[r * WG + lid];
        if OUT_DT == 1u || OUT_DT == 2u {
            // N is even (the launcher goes through f32 otherwise): the even
            // column writes the word it shares with the next one
            if col % 2u == 0u {
                dst[e >> 1u] = encode_pair(v, partial[r * WG + lid + LANES], OUT_DT);
            }
        } else {
            dst[e] = bitcast<u32>(v);
        }
    }
}
