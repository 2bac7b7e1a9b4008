// attention.wgsl — softmax(q kᵀ · scale + mask) v for one query row per
// workgroup of 64 threads, over chunks of 64 keys with an online softmax
// (running maximum m, running sum l, rescaled accumulators), so no score
// matrix is stored. Per chunk: thread t scores key j0 + t, the workgroup
// reduces the chunk's maximum and sum, then each thread accumulates the
// weighted values of its own dimensions (2t, 2t+1, 2t+128, 2t+129).
// q, k, v, mask are rank-4 strided views: q [B, Tq, H, D], k and v
// [B, Tk, KVH, D], mask [B, H, Tq, Tk]. The output is contiguous
// [B, Tq, H, D]; D is even and at most 256, so 16-bit outputs are written
// as whole words by the thread that owns both elements.

struct Params {
    batch: u32,
    tq: u32,
    tk: u32,
    heads: u32,
    kv_heads: u32,
    d: u32,
    scale: f32,
    causal: u32,
    off_q: u32,
    off_k: u32,
    off_v: u32,
    off_m: u32,
    sq: vec4<u32>,
    sk: vec4<u32>,
    sv: vec4<u32>,
    sm: vec4<u32>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src_q: array<u32>;
@group(0) @binding(2) var<storage, read> src_k: array<u32>;
@group(0) @binding(3) var<storage, read> src_v: array<u32>;
@group(0) @binding(4) var<storage, read> src_m: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<u32>;

override DT: u32 = 0u;
override OUT_DT: u32 = 0u;
override HAS_MASK: bool = false;

const T: u32 = 64u;
const NEG_INF: f32 = -3.4028235e38;

var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;

fn ld_q(e: u32) -> f32 {
    return decode(src_q[word_index(e, DT)], e, DT);
}
fn ld_k(e: u32) -> f32 {
    return decode(src_k[word_index(e, DT)], e, DT);
}
fn ld_v(e: u32) -> f32 {
    return decode(src_v[word_index(e, DT)], e, DT);
}
fn ld_m(e: u32) -> f32 {
    return decode(src_m[word_index(e, DT)], e, DT);
}

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
        qs[c] = ld_q(q0 + c * p.sq.w) * p.scale;
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
                dot = fma(qs[c], ld_k(kr + c * p.sk.w), dot);
            }
            s = dot;
            if HAS_MASK {
                s += ld_m(m0 + j * p.sm.w);
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
                acc.x = fma(w, ld_v(vr + c0 * p.sv.w), acc.x);
                acc.y = fma(w, ld_v(vr + (c0 + 1u) * p.sv.w), acc.y);
            }
            if c0 + 128u < p.d {
                acc.z = fma(w, ld_v(vr + (c0 + 128u) * p.sv.w), acc.z);
                acc.w = fma(w, ld_v(vr + (c0 + 129u) * p.sv.w), acc.w);
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
