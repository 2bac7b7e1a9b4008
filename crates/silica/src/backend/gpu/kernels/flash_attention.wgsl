// flash_attention.wgsl — attention for many queries (prefill), flash-
// attention style: a workgroup of 128 threads takes BQ = 32 queries of one
// (batch, head) and walks the keys in tiles of BK (a constant placed before
// this file: 32 where the device has 48 KiB of workgroup memory, 16 where
// it has 32 KiB), staged with the values in workgroup memory as f32. Each
// query row has four threads, s = 0..3:
// - scores: thread s scores keys s·BK/4 .. (s+1)·BK/4 of the tile over the
//   whole head (q and k from workgroup memory);
// - the scores replace the K tile (the same workgroup memory), then every
//   thread of the row reads the row's BK scores, keeps the row's running
//   maximum m and sum l (all four threads hold the same m and l, so no
//   exchange is needed), and accumulates p·v for its own dimensions:
//   chunks of four, s, s + 4, ..., so that up to 8 vec4 accumulators (head
//   sizes up to 128) stay in registers.
// Causal: the queries are the last Tq of the Tk positions; key tiles past
// the block's last visible key are not loaded at all. Head sizes that are
// not multiples of 4 are padded with zeros in workgroup memory.
// Workgroup memory: q 32×32 vec4 (16 KiB) + k, v BK×32 vec4 each.

override OUT_DT: u32 = 0u;

const BQ: u32 = 32u;
// vec4 chunks of a head row in workgroup memory (head size <= 128)
const ROW: u32 = 32u;
// accumulator chunks per thread
const NU: u32 = 8u;
// keys scored per thread per tile
const KS: u32 = BK / 4u;

// [BQ, ROW], chunk c of row r at r·ROW + (c ^ (r & 7)) (fewer bank conflicts)
var<workgroup> qsh: array<vec4<f32>, 1024>;
// [BK, ROW] keys (swizzled as qsh), then the scores [BQ, BK] as vec4s
var<workgroup> ksh: array<vec4<f32>, BK * ROW>;
// [BK, ROW] values
var<workgroup> vsh: array<vec4<f32>, BK * ROW>;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let blocks = (p.tq + BQ - 1u) / BQ;
    let g = group_index(wid, nwg);
    // a whole workgroup leaves together, so barriers stay in uniform control flow
    if g >= p.batch * p.heads * blocks {
        return;
    }
    // the longest (causal) blocks first
    let qb = blocks - 1u - g % blocks;
    let h = (g / blocks) % p.heads;
    let b = g / (blocks * p.heads);
    let kvh = h / (p.heads / p.kv_heads);
    let i0 = qb * BQ;
    let d4 = (p.d + 3u) / 4u;
    let r = lid / 4u;
    let s = lid % 4u;
    let i = i0 + r;
    let shift = p.tk - p.tq;

    // q tile, scaled
    let q0 = p.off_q + b * p.sq.x + h * p.sq.z;
    for (var e = lid; e < BQ * d4; e += 128u) {
        let rr = e / d4;
        let c = e % d4;
        var x = vec4<f32>(0.0);
        if i0 + rr < p.tq {
            x = ld4(Q, q0 + (i0 + rr) * p.sq.y + 4u * c * p.sq.w, chunk_len(c, p.d), p.sq.w) * p.scale;
        }
        qsh[rr * ROW + (c ^ (rr & 7u))] = x;
    }

    // keys up to `end` are visible to some query of the block
    var end = p.tk;
    if p.causal != 0u {
        end = min(p.tk, min(i0 + BQ, p.tq) + shift);
    }
    // keys up to `row_end` are visible to this thread's query
    var row_end = select(0u, p.tk, i < p.tq);
    if p.causal != 0u && i < p.tq {
        row_end = i + shift + 1u;
    }
    let k0 = p.off_k + b * p.sk.x + kvh * p.sk.z;
    let v0 = p.off_v + b * p.sv.x + kvh * p.sv.z;
    let m0 = p.off_m + b * p.sm.x + h * p.sm.y + i * p.sm.z;
    var m = NEG_INF;
    var l = 0.0;
    var acc: array<vec4<f32>, NU>;
    for (var u = 0u; u < NU; u++) {
        acc[u] = vec4<f32>(0.0);
    }
    for (var j0 = 0u; j0 < end; j0 += BK) {
        // stage the tile; keys past Tk are zeros (workgroup memory starts as garbage)
        for (var e = lid; e < BK * d4; e += 128u) {
            let j = e / d4;
            let c = e % d4;
            var kx = vec4<f32>(0.0);
            var vx = vec4<f32>(0.0);
            if j0 + j < p.tk {
                let n = chunk_len(c, p.d);
                kx = ld4(K, k0 + (j0 + j) * p.sk.y + 4u * c * p.sk.w, n, p.sk.w);
                vx = ld4(V, v0 + (j0 + j) * p.sv.y + 4u * c * p.sv.w, n, p.sv.w);
            }
            ksh[j * ROW + (c ^ (j & 7u))] = kx;
            vsh[j * ROW + c] = vx;
        }
        workgroupBarrier();

        var sc: array<f32, KS>;
        for (var t = 0u; t < KS; t++) {
            sc[t] = 0.0;
        }
        for (var c = 0u; c < d4; c++) {
            let qv = qsh[r * ROW + (c ^ (r & 7u))];
            for (var t = 0u; t < KS; t++) {
                let j = s * KS + t;
                sc[t] += dot(qv, ksh[j * ROW + (c ^ (j & 7u))]);
            }
        }
        for (var t = 0u; t < KS; t++) {
            let j = j0 + s * KS + t;
            if j < row_end {
                var x = sc[t];
                if HAS_MASK {
                    x += elem(MASK, m0 + j * p.sm.w);
                }
                // -inf (a hidden key) is kept as the lowest finite value so
                // that differences below stay finite
                sc[t] = max(x, NEG_INF);
            } else {
                sc[t] = NEG_INF;
            }
        }
        // every thread is done with the K tile: the scores take its place
        workgroupBarrier();
        for (var w = 0u; w < KS / 4u; w++) {
            ksh[r * (BK / 4u) + s * (KS / 4u) + w] = vec4<f32>(sc[4u * w], sc[4u * w + 1u], sc[4u * w + 2u], sc[4u * w + 3u]);
        }
        workgroupBarrier();

        var mx = NEG_INF;
        for (var w = 0u; w < BK / 4u; w++) {
            let x = ksh[r * (BK / 4u) + w];
            mx = max(mx, max(max(x.x, x.y), max(x.z, x.w)));
        }
        if mx > m {
            let alpha = exp(m - mx);
            l *= alpha;
            for (var u = 0u; u < NU; u++) {
                acc[u] *= alpha;
            }
            m = mx;
        }
        if mx > NEG_INF {
            for (var w = 0u; w < BK / 4u; w++) {
                let x = ksh[r * (BK / 4u) + w];
                let pw = select(exp(x - m), vec4<f32>(0.0), x <= vec4<f32>(NEG_INF));
                l += pw.x + pw.y + pw.z + pw.w;
                for (var e = 0u; e < 4u; e++) {
                    let pj = pw[e];
                    let vr = (4u * w + e) * ROW;
                    for (var u = 0u; u < NU; u++) {
                        let c = s + 4u * u;
                        if c < d4 {
                            acc[u] = fma(vec4<f32>(pj), vsh[vr + c], acc[u]);
                        }
                    }
                }
            }
        }
        // the next tile overwrites ksh and vsh
        workgroupBarrier();
    }

    if i >= p.tq {
        return;
    }
    let out0 = ((b * p.tq + i) * p.heads + h) * p.d;
    for (var u = 0u; u < NU; u++) {
        let c = s + 4u * u;
        if c >= d4 {
            break;
        }
        // no visible key: NaN, as on the CPU (0 / 0 is not reliably NaN on GPUs)
        let y = select(acc[u] / l, vec4<f32>(bitcast<f32>(0x7fc00000u)), l == 0.0);
        let e = out0 + 4u * c;
        let n = chunk_len(c, p.d);
        if OUT_DT == 1u || OUT_DT == 2u {
            dst[e >> 1u] = encode_pair(y.x, y.y, OUT_DT);
            if n == 4u {
                dst[(e >> 1u) + 1u] = encode_pair(y.z, y.w, OUT_DT);
            }
        } else {
            dst[e] = bitcast<u32>(y.x);
            dst[e + 1u] = bitcast<u32>(y.y);
            if n == 4u {
                dst[e + 2u] = bitcast<u32>(y.z);
                dst[e + 3u] = bitcast<u32>(y.w);
            }
        }
    }
}
