// lanes_sg.wgsl — lanes.wgsl's sums over a lane set through subgroup
// shuffles: butterflies over the lanes of a subgroup (subgroups are runs of
// consecutive local indices, of one width, as rows_sg.wgsl takes them), so
// that every lane of a run of min(width, LANES) holds the run's sum; the
// first lane of each run writes it, and where a set spans several runs
// (width < LANES, as on lavapipe) its first lane adds the runs' slots. Two
// barriers instead of 1 + log2(LANES).

fn lane_sums(lid: u32, lane: u32, acc_in: Accs) {
    var acc = acc_in;
    let width = subgroupAdd(1u);
    for (var s = LANES / 2u; s > 0u; s >>= 1u) {
        for (var i = 0u; i < R * M; i++) {
            // lanes s apart in one subgroup: the same set, as s < LANES
            let other = subgroupShuffleXor(acc[i], s);
            acc[i] += select(0.0, other, s < width);
        }
    }
    let run = min(width, LANES);
    if lid % run == 0u {
        for (var i = 0u; i < R * M; i++) {
            partial[i * WG + lid] = acc[i];
        }
    }
    workgroupBarrier();
    if lane == 0u {
        for (var j = run; j < LANES; j += run) {
            for (var i = 0u; i < R * M; i++) {
                partial[i * WG + lid] += partial[i * WG + lid + j];
            }
        }
    }
    workgroupBarrier();
}
