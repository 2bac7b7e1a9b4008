// attention.wgsl — softmax(q kᵀ · scale + mask) v for one query row per
// workgroup of 64 threads, over chunks of 64 keys with an online softmax
// (running maximum m, running sum l, rescaled accumulators), so no score
// matrix is stored. Per chunk: thread t scores key j0 + t, the workgroup
// reduces the chunk's maximum and sum, then each thread accumulates the
// weighted values of its own dimensions (2t, 2t+1, 2t+128, 2t+129).
// The fallback for head sizes over 128 (attention_io.wgsl has the views).
// The output is contiguous [B, Tq, H, D]; D is even and at most 256, so
// 16-bit outputs are written as whole words by the thread that owns both
// elements.

override OUT_DT: u32 = 0u;

const T: u32 = 64u;

var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;

fn reduce_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = T / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = T / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    // rows in the output's order: row = (b * Tq + i) * H + h
    let row = group_index(wid, nwg);
    let rows = p.batch * p.tq * p.heads;
    // a whole workgroup leaves together, so barriers stay in uniform control flow
    if row >= rows {
        return;
    }
    let h = row % p.heads;
    let i = (row / p.heads) % p.tq;
    let b = row / (p.heads * p.tq);
    let kvh = h / (p.heads / p.kv_heads);
    let q0 = p.off_q + b * p.sq.x + i * p.sq.y + h * p.sq.z;
    for (var c = lid; c < p.d; c += T) {
        qs[c] = elem(Q, q0 + c * p.sq.w) * p.scale;
    }
    workgroupBarrier();
    var visible = p.tk;
    if p.causal != 0u {
        visible = i + (p.tk - p.tq) + 1u;
    }
    let k0 = p.off_k + b * p.sk.x + kvh * p.sk.z;
    let v0 = p.off_v + b * p.sv.x + kvh * p.sv.z;
    let m0 = p.off_m + b * p.sm.x + h * p.sm.y + i * p.sm.z;
    var m = NEG_INF;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var j0 = 0u; j0 < visible; j0 += T) {
        let j = j0 + lid;
        var s = NEG_INF;
        if j < visible {
            let kr = k0 + j * p.sk.y;
            var dot = 0.0;
            for (var c = 0u; c < p.d; c++) {
                dot = fma(qs[c], elem(K, kr + c * p.sk.w), dot);
            }
            s = dot;
            if HAS_MASK {
                s += elem(MASK, m0 + j * p.sm.w);
            }
            // -inf (a hidden key) is kept as the lowest finite value so that
            // differences below stay finite
            s = max(s, NEG_INF);
        }
        let m_new = max(m, reduce_max(s, lid));
        var pj = 0.0;
        if s > NEG_INF {
            pj = exp(s - m_new);
        }
        ps[lid] = pj;
        let alpha = exp(m - m_new);
        l = l * alpha + reduce_sum(pj, lid);
        acc *= alpha;
        let n = min(T, visible - j0);
        let c0 = 2u * lid;
        for (var t = 0u; t < n; t++) {
            let w = ps[t];
            let vr = v0 + (j0 + t) * p.sv.y;
            if c0 < p.d {
                acc.x = fma(w, elem(V, vr + c0 * p.sv.w), acc.x);
                acc.y = fma(w, elem(V, vr + (c0 + 1u) * p.sv.w), acc.y);
            }
            if c0 + 128u < p.d {
                acc.z = fma(w, elem(V, vr + (c0 + 128u) * p.sv.w), acc.z);
                acc.w = fma(w, elem(V, vr + (c0 + 129u) * p.sv.w), acc.w);
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    // no visible key: NaN, as on the CPU (0 / 0 is not reliably NaN on GPUs)
    let y = select(acc / l, vec4<f32>(bitcast<f32>(0x7fc00000u)), l == 0.0);
    let out0 = row * p.d;
    for (var half = 0u; half < 2u; half++) {
        let c = 2u * lid + half * 128u;
        if c >= p.d {
            break;
        }
        let y0 = select(y.x, y.z, half == 1u);
        let y1 = select(y.y, y.w, half == 1u);
        if OUT_DT == 1u || OUT_DT == 2u {
            dst[(out0 + c) >> 1u] = encode_pair(y0, y1, OUT_DT);
        } else {
            dst[out0 + c] = bitcast<u32>(y0);
            dst[out0 + c + 1u] = bitcast<u32>(y1);
        }
    }
}
