// qgemv.wgsl — dst = x @ wᵀ for few rows of x (M <= 8: decode), w in a
// GGML block format. LANES threads share one weight row (one output
// column), each decoding whole groups of 32 (lane, lane + LANES, ...) and
// dotting them with the M rows of x; a tree sum in workgroup memory joins
// the lanes. 256 / LANES columns per workgroup; the grid may be 2-D when
// the columns need more than 65,535 workgroups.

override M: u32 = 1u;
override LANES: u32 = 32u;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let col = group_index(wid, nwg) * (WG / LANES) + lid / LANES;
    var acc: array<f32, 8>;
    if col < p.n {
        let groups = p.k / 32u;
        for (var gi = lane; gi < groups; gi += LANES) {
            let at = group_at(col, gi);
            let s = group_scale(at.x, at.y);
            let x0 = p.off_x + gi * 32u;
            for (var q = 0u; q < 4u; q++) {
                let v = part_values(at.x, at.y, q, s);
                let ko = part_k(q);
                for (var r = 0u; r < M; r++) {
                    let xr = x0 + r * p.k;
                    acc[r] += dot(v[0], x4(xr + ko.x)) + dot(v[1], x4(xr + ko.y));
                }
            }
        }
    }
    gemv_finish(acc, lid, col, 0u);
}
