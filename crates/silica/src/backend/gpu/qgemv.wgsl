// qgemv.wgsl — dst = x @ wᵀ for few rows of x (M <= 8: decode), w in a
// GGML block format. LANES threads share R adjacent weight rows (R output
// columns). Four neighbouring lanes decode one group of 32 values, a part
// of 8 each, so that a subgroup's loads of x and of the blocks fall on few
// cache lines: lanes 4i..4i+3 take group i (then i + LANES / 4, ...), and
// the x values a lane loads serve all R rows. A tree sum in workgroup
// memory joins the lanes. 256 / LANES lane sets per workgroup; the grid may
// be 2-D when the columns need more than 65,535 workgroups.

override M: u32 = 1u;
override LANES: u32 = 32u;
// Weight rows per lane set; R * M <= 8 (the accumulators and the slots of
// the final sum).
override R: u32 = 1u;

var<workgroup> partial: array<f32, 2048>; // [R * M <= 8][256]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let q = lane % 4u;
    let col0 = (group_index(wid, nwg) * (WG / LANES) + lid / LANES) * R;
    let ko = part_k(q);
    let groups = p.k / 32u;
    var acc: array<f32, 8>;
    if col0 < p.n {
        for (var gi = lane / 4u; gi < groups; gi += LANES / 4u) {
            // this lane's 8 values of x in each of the M rows
            var xs: array<vec4<f32>, 16>;
            for (var r = 0u; r < M; r++) {
                let xr = p.off_x + r * p.k + gi * 32u;
                xs[2u * r] = x4(xr + ko.x);
                xs[2u * r + 1u] = x4(xr + ko.y);
            }
            for (var c = 0u; c < R; c++) {
                let col = min(col0 + c, p.n - 1u);
                let at = group_at(col, gi);
                let v = part_values(at.x, at.y, q, group_scale(at.x, at.y));
                for (var r = 0u; r < M; r++) {
                    acc[c * M + r] += dot(v[0], xs[2u * r]) + dot(v[1], xs[2u * r + 1u]);
                }
            }
        }
    }
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
    if lane != 0u {
        return;
    }
    for (var c = 0u; c < R; c++) {
        let col = col0 + c;
        if col >= p.n {
            return;
        }
        for (var r = 0u; r < M; r++) {
            let e = r * p.n + col;
            let v = partial[(c * M + r) * WG + lid];
            if OUT_DT == 1u || OUT_DT == 2u {
                // N is even (the launcher goes through f32 otherwise): the
                // even column writes the word it shares with the next one,
                // which is this lane set's next row or the next lane set's
                // first
                if col % 2u == 0u {
                    var next: f32;
                    if R > 1u {
                        next = partial[((c + 1u) * M + r) * WG + lid];
                    } else {
                        next = partial[r * WG + lid + LANES];
                    }
                    dst[e >> 1u] = encode_pair(v, next, OUT_DT);
                }
            } else {
                dst[e] = bitcast<u32>(v);
            }
        }
    }
}
