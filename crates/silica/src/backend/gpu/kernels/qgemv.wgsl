// qgemv.wgsl — dst = x @ wᵀ for few rows of x (M <= 8: decode), w in a
// GGML block format. LANES threads share R adjacent weight rows (R output
// columns). Four neighbouring lanes decode one group of 32 values, a part
// of 8 each, so that a subgroup's loads of x and of the blocks fall on few
// cache lines: lanes 4i..4i+3 take group i (then i + LANES / 4, ...), and
// the x values a lane loads serve all R rows. A tree sum in workgroup
// memory joins the lanes. 256 / LANES lane sets per workgroup; the grid may
// be 2-D when the columns need more than 65,535 workgroups.

// The fusions are qgemv_common.wgsl's.

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    start_chunk(wid);
    let lane = lid % LANES;
    let q = lane % 4u;
    let col0 = (group_index(wid, nwg) * (WG / LANES) + lid / LANES) * OC;
    let ko = part_k(q);
    let groups = p.k / 32u;
    let early = residual_words(lane, col0);
    let lb = low_rank_words(lane, col0);
    let lr = fetch_low_rank(lid);
    if NORM {
        // sums of squares of the M rows of x, then 1 / rms of each
        var ss: RowSums;
        for (var r = 0u; r < M; r++) {
            var s = 0.0;
            for (var e = lid * 4u; e < p.k; e += 4u * WG) {
                let v = x4(p.off_x + x_row(r) * p.k + e);
                s += dot(v, v);
            }
            ss[r] = s;
        }
        publish_rms(lid, ss);
    }
    if LORA_IN {
        project_low_rank(lid, lr);
    }
    var acc: Accs;
    if col0 < p.n {
        for (var gi = lane / 4u; gi < groups; gi += LANES / 4u) {
            // this lane's 8 values of x in each of the M rows
            var xs: array<vec4<f32>, 16>;
            var gl = vec4<f32>(1.0);
            var gh = vec4<f32>(1.0);
            if NORM {
                gl = g4(gi * 32u + ko.x);
                gh = g4(gi * 32u + ko.y);
            }
            // the sums of those values, for part_biased's form
            var xsum: array<f32, 8>;
            for (var r = 0u; r < M; r++) {
                let xr = p.off_x + x_row(r) * p.k + gi * 32u;
                xs[2u * r] = x4(xr + ko.x) * gl;
                xs[2u * r + 1u] = x4(xr + ko.y) * gh;
                if has_biased() {
                    xsum[r] = dot(xs[2u * r] + xs[2u * r + 1u], vec4<f32>(1.0));
                }
            }
            for (var c = 0u; c < R; c++) {
                let at = group_at(weight_row(col0, c), gi);
                if has_biased() {
                    // value = d u + m, and the dot of u with x is
                    // 2^B (S - X): d 2^B S + (m - d 2^B) X, one FMA a weight
                    let f = part_biased(at.x, q);
                    let s = group_scale(at.x, at.y);
                    var d = s.x;
                    var m = s.y;
                    if FMT == 0u {
                        m = -128.0 * d;
                    }
                    d *= f32(1u << biased_bits());
                    m -= d;
                    for (var r = 0u; r < M; r++) {
                        let dot_f = dot(f[0], xs[2u * r]) + dot(f[1], xs[2u * r + 1u]);
                        acc[c * M + r] += d * dot_f + m * xsum[r];
                    }
                } else {
                    let v = part_values(at.x, at.y, q, group_scale(at.x, at.y));
                    for (var r = 0u; r < M; r++) {
                        acc[c * M + r] += dot(v[0], xs[2u * r]) + dot(v[1], xs[2u * r + 1u]);
                    }
                }
            }
        }
    }
    finish(lid, lane, col0, acc, early, lb);
}
