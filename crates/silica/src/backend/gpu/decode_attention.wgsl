// decode_attention.wgsl — attention for few queries over a long KV cache,
// split over the keys (flash-decoding): a workgroup of 128 threads takes
// `chunk` keys of one query row (b, i, h) and writes its partial result,
// (maximum m, sum l, unnormalized accumulator acc[D]) as f32 words, to the
// scratch buffer `dst`: [rows, chunks, record], rows in the output's order.
// attention_combine.wgsl then merges the chunks of each row. With FINAL
// (one chunk holds every key, and the head size is a multiple of 4) the
// workgroup normalizes its result and writes the output row itself, in
// OUT_DT, and no merge pass runs.
// Threads: 32 key lanes × 4 dimension slices. Per step of 32 keys, thread
// (lane, s) takes the dot product of key lane + step over chunks s, s + 4,
// ... of the head; the four partials meet in workgroup memory; each lane
// keeps its own running m and l and accumulates p·v for its slice. At the
// end the 32 lanes are merged in workgroup memory. Head size <= 128.

const LANES: u32 = 32u;
const ROW: u32 = 32u;
const NU: u32 = 8u;

override FINAL: bool = false;
override OUT_DT: u32 = 0u;

var<workgroup> qsh: array<vec4<f32>, ROW>;
var<workgroup> part: array<f32, 128>;
var<workgroup> lane_m: array<f32, LANES>;
var<workgroup> lane_l: array<f32, LANES>;
// [LANES, ROW]
var<workgroup> lane_acc: array<vec4<f32>, 1024>;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let rows = p.batch * p.tq * p.heads;
    // a whole workgroup leaves together, so barriers stay in uniform control flow
    if g >= rows * p.chunks {
        return;
    }
    let chunk = g % p.chunks;
    let row = g / p.chunks;
    let h = row % p.heads;
    let i = (row / p.heads) % p.tq;
    let b = row / (p.heads * p.tq);
    let kvh = h / (p.heads / p.kv_heads);
    let d4 = (p.d + 3u) / 4u;
    let lane = lid / 4u;
    let s = lid % 4u;

    let q0 = p.off_q + b * p.sq.x + i * p.sq.y + h * p.sq.z;
    if lid < d4 {
        qsh[lid] = ld4(Q, q0 + 4u * lid * p.sq.w, chunk_len(lid, p.d), p.sq.w) * p.scale;
    }
    workgroupBarrier();
    var qv: array<vec4<f32>, NU>;
    for (var u = 0u; u < NU; u++) {
        let c = s + 4u * u;
        qv[u] = select(vec4<f32>(0.0), qsh[min(c, ROW - 1u)], c < d4);
    }

    var visible = p.tk;
    if p.causal != 0u {
        visible = i + (p.tk - p.tq) + 1u;
    }
    let begin = chunk * p.chunk;
    let end = min(begin + p.chunk, visible);
    let k0 = p.off_k + b * p.sk.x + kvh * p.sk.z;
    let v0 = p.off_v + b * p.sv.x + kvh * p.sv.z;
    let m0 = p.off_m + b * p.sm.x + h * p.sm.y + i * p.sm.z;
    var m = NEG_INF;
    var l = 0.0;
    var acc: array<vec4<f32>, NU>;
    for (var u = 0u; u < NU; u++) {
        acc[u] = vec4<f32>(0.0);
    }
    // `end` is the same for the whole workgroup: barriers stay uniform
    for (var j0 = begin; j0 < end; j0 += LANES) {
        let j = j0 + lane;
        var dotp = 0.0;
        if j < end {
            let kr = k0 + j * p.sk.y;
            for (var u = 0u; u < NU; u++) {
                let c = s + 4u * u;
                if c < d4 {
                    dotp += dot(qv[u], ld4(K, kr + 4u * c * p.sk.w, chunk_len(c, p.d), p.sk.w));
                }
            }
        }
        part[lid] = dotp;
        workgroupBarrier();
        if j < end {
            var x = part[4u * lane] + part[4u * lane + 1u] + part[4u * lane + 2u] + part[4u * lane + 3u];
            if HAS_MASK {
                x += elem(MASK, m0 + j * p.sm.w);
            }
            // a hidden key (-inf) weighs nothing
            if x > NEG_INF {
                if x > m {
                    let alpha = exp(m - x);
                    l *= alpha;
                    for (var u = 0u; u < NU; u++) {
                        acc[u] *= alpha;
                    }
                    m = x;
                }
                let pj = exp(x - m);
                l += pj;
                let vr = v0 + j * p.sv.y;
                for (var u = 0u; u < NU; u++) {
                    let c = s + 4u * u;
                    if c < d4 {
                        acc[u] = fma(vec4<f32>(pj), ld4(V, vr + 4u * c * p.sv.w, chunk_len(c, p.d), p.sv.w), acc[u]);
                    }
                }
            }
        }
        // the next step overwrites `part`
        workgroupBarrier();
    }

    // merge the lanes: weights exp(m_lane - M)
    if s == 0u {
        lane_m[lane] = m;
        lane_l[lane] = l;
    }
    for (var u = 0u; u < NU; u++) {
        let c = s + 4u * u;
        if c < d4 {
            lane_acc[lane * ROW + c] = acc[u];
        }
    }
    workgroupBarrier();
    var big = NEG_INF;
    for (var x = 0u; x < LANES; x++) {
        big = max(big, lane_m[x]);
    }
    let out0 = g * p.record;
    if FINAL {
        if lid < d4 {
            var y = vec4<f32>(0.0);
            var sum = 0.0;
            for (var x = 0u; x < LANES; x++) {
                let w = exp(lane_m[x] - big);
                y = fma(vec4<f32>(w), lane_acc[x * ROW + lid], y);
                sum = fma(w, lane_l[x], sum);
            }
            // no visible key: NaN, as in attention_combine.wgsl
            y = select(y / sum, vec4<f32>(bitcast<f32>(0x7fc00000u)), sum == 0.0);
            // g is the row (one chunk); d is a multiple of 4
            let e = g * p.d + 4u * lid;
            if OUT_DT == 1u || OUT_DT == 2u {
                dst[e >> 1u] = encode_pair(y.x, y.y, OUT_DT);
                dst[(e >> 1u) + 1u] = encode_pair(y.z, y.w, OUT_DT);
            } else {
                dst[e] = bitcast<u32>(y.x);
                dst[e + 1u] = bitcast<u32>(y.y);
                dst[e + 2u] = bitcast<u32>(y.z);
                dst[e + 3u] = bitcast<u32>(y.w);
            }
        }
        return;
    }
    if lid < d4 {
        var y = vec4<f32>(0.0);
        for (var x = 0u; x < LANES; x++) {
            y = fma(vec4<f32>(exp(lane_m[x] - big)), lane_acc[x * ROW + lid], y);
        }
        let e = out0 + 4u + 4u * lid;
        dst[e] = bitcast<u32>(y.x);
        dst[e + 1u] = bitcast<u32>(y.y);
        dst[e + 2u] = bitcast<u32>(y.z);
        dst[e + 3u] = bitcast<u32>(y.w);
    }
    if lid == 0u {
        var sum = 0.0;
        for (var x = 0u; x < LANES; x++) {
            sum = fma(exp(lane_m[x] - big), lane_l[x], sum);
        }
        dst[out0] = bitcast<u32>(big);
        dst[out0 + 1u] = bitcast<u32>(sum);
    }
}
