// lanes.wgsl — the sum over each lane set of the GEMV kernels
// (qgemv_common.wgsl): lane set s holds lanes s * LANES .. s * LANES +
// LANES - 1, and after `lane_sums` the first lane's slot of `partial`
// (partial[i * WG + lid], i < R * M) holds the set's sum of acc[i], visible
// to every thread of the workgroup. A tree in workgroup memory, one
// barrier a level. The launcher substitutes lanes_sg.wgsl where the
// adapter's subgroups have one width (see `kernel_source`).

fn lane_sums(lid: u32, lane: u32, acc: Accs) {
    for (var i = 0u; i < R * M; i++) {
        partial[i * WG + lid] = acc[i];
    }
    workgroupBarrier();
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        if lane < s {
            for (var i = 0u; i < R * M; i++) {
                partial[i * WG + lid] += partial[i * WG + lid + s];
            }
        }
        workgroupBarrier();
    }
}
