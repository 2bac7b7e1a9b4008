// qgemv.wgsl — dst = x @ wᵀ for few rows of x (M <= 8: decode), w in a
// GGML block format. LANES threads share R adjacent weight rows (R output
// columns). Four neighbouring lanes decode one group of 32 values, a part
// of 8 each, so that a subgroup's loads of x and of the blocks fall on few
// cache lines: lanes 4i..4i+3 take group i (then i + LANES / 4, ...), and
// the x values a lane loads serve all R rows. A tree sum in workgroup
// memory joins the lanes. 256 / LANES lane sets per workgroup; the grid may
// be 2-D when the columns need more than 65,535 workgroups.
//
// Fusions (override constants), in the order they apply:
// - NORM: x is replaced by rms_norm(x) * g. Every workgroup sums the
//   squares of the M rows itself (x is small and stays in cache), scales x
//   by g as it loads it and the sums by 1 / rms at the end.
// - SWIGLU: w holds gate [N, K] then up [N, K]; a lane set takes R / 2
//   columns of each and writes silu(gate) * up.
// - RESIDUAL: the residual r [M, N] (dtype RES_DT) is added.

@group(0) @binding(0) var<uniform> p: QParams;
@group(0) @binding(1) var<storage, read> src_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_w: array<u32>;
@group(0) @binding(3) var<storage, read> src_g: array<u32>;
@group(0) @binding(4) var<storage, read> src_r: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<u32>;

override M: u32 = 1u;
override LANES: u32 = 32u;
// Weight rows per lane set; R * M <= 8 (the accumulators and the slots of
// the final sum).
override R: u32 = 1u;
override NORM: bool = false;
override SWIGLU: bool = false;
override RESIDUAL: bool = false;
// Output columns per lane set: R, or R / 2 with SWIGLU.
override OC: u32 = 1u;
// dtype code of the residual (the norm weight has x's dtype)
override RES_DT: u32 = 0u;

var<workgroup> partial: array<f32, 2048>; // [R * M <= 8][256]
var<workgroup> inv_rms: array<f32, 8>;

// Norm weight elements e..e+3 (e a multiple of 4, off_g a multiple of 8).
fn g4(e: u32) -> vec4<f32> {
    let i = p.off_g + e;
    if IN_DT == 0u {
        return vec4<f32>(bitcast<f32>(src_g[i]), bitcast<f32>(src_g[i + 1u]), bitcast<f32>(src_g[i + 2u]), bitcast<f32>(src_g[i + 3u]));
    }
    let a = src_g[i >> 1u];
    let b = src_g[(i >> 1u) + 1u];
    if IN_DT == 1u {
        return vec4<f32>(unpack2x16float(a), unpack2x16float(b));
    }
    return vec4<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xffff0000u), bitcast<f32>(b << 16u), bitcast<f32>(b & 0xffff0000u));
}

// The result of output column j of this lane set (slot: the lane set's
// first thread) for row r of x, before the residual.
fn result(j: u32, r: u32, slot: u32) -> f32 {
    var v = partial[(j * M + r) * WG + slot];
    if NORM {
        v *= inv_rms[r];
    }
    if SWIGLU {
        var u = partial[((OC + j) * M + r) * WG + slot];
        if NORM {
            u *= inv_rms[r];
        }
        v = v / (1.0 + exp(-v)) * u;
    }
    return v;
}

fn with_residual(v: f32, e: u32) -> f32 {
    if RESIDUAL {
        let i = p.off_r + e;
        return v + decode(src_r[word_index(i, RES_DT)], i, RES_DT);
    }
    return v;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let q = lane % 4u;
    let col0 = (group_index(wid, nwg) * (WG / LANES) + lid / LANES) * OC;
    let ko = part_k(q);
    let groups = p.k / 32u;
    if NORM {
        // sums of squares of the M rows of x, then 1 / rms of each
        for (var r = 0u; r < M; r++) {
            var s = 0.0;
            for (var e = lid * 4u; e < p.k; e += 4u * WG) {
                let v = x4(p.off_x + r * p.k + e);
                s += dot(v, v);
            }
            partial[r * WG + lid] = s;
        }
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s >>= 1u) {
            if lid < s {
                for (var r = 0u; r < M; r++) {
                    partial[r * WG + lid] += partial[r * WG + lid + s];
                }
            }
            workgroupBarrier();
        }
        if lid < M {
            inv_rms[lid] = inverseSqrt(partial[lid * WG] / f32(p.k) + bitcast<f32>(p.eps));
        }
        workgroupBarrier();
    }
    var acc: array<f32, 8>;
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
                let xr = p.off_x + r * p.k + gi * 32u;
                xs[2u * r] = x4(xr + ko.x) * gl;
                xs[2u * r + 1u] = x4(xr + ko.y) * gh;
                if has_biased() {
                    xsum[r] = dot(xs[2u * r] + xs[2u * r + 1u], vec4<f32>(1.0));
                }
            }
            for (var c = 0u; c < R; c++) {
                // the weight row of accumulator c: with SWIGLU the first
                // OC are gate rows, the others the up rows of the same columns
                var row = min(col0 + c % OC, p.n - 1u);
                if SWIGLU && c >= OC {
                    row += p.n;
                }
                let at = group_at(row, gi);
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
    for (var j = 0u; j < OC; j++) {
        let col = col0 + j;
        if col >= p.n {
            return;
        }
        for (var r = 0u; r < M; r++) {
            let e = r * p.n + col;
            let v = with_residual(result(j, r, lid), e);
            if OUT_DT == 1u || OUT_DT == 2u {
                // N is even (the launcher goes through f32 otherwise): the
                // even column writes the word it shares with the next one,
                // which is this lane set's next column or the next lane
                // set's first
                if col % 2u == 0u {
                    var next: f32;
                    if OC > 1u {
                        next = result(j + 1u, r, lid);
                    } else {
                        next = result(0u, r, lid + LANES);
                    }
                    dst[e >> 1u] = encode_pair(v, with_residual(next, e + 1u), OUT_DT);
                }
            } else {
                dst[e] = bitcast<u32>(v);
            }
        }
    }
}
