// decode_attention.wgsl — attention for few queries over a long KV cache,
// split over the keys (flash-decoding): a workgroup of 128 threads takes
// `chunk` (at most 256) keys of one query row (b, i, h) and writes its
// partial result, (maximum m, sum l, unnormalized accumulator acc[D]) as
// f32 words, to the scratch buffer `dst`: [rows, chunks, record], rows in
// the output's order. attention_combine.wgsl then merges the chunks of
// each row. With FINAL (one chunk holds every key, and the head size is a
// multiple of 4) the workgroup normalizes its result and writes the output
// row itself, in OUT_DT, and no merge pass runs.
// Every key of the chunk is scored at once (scores.wgsl, or with
// subgroups scores_sg.wgsl, where a few lanes share each key); the scores
// go to workgroup memory, where the maximum and the sum of the weights are
// reduced. Then thread t takes dimension chunk t % D4 (4 dimensions) for
// the keys congruent to t / D4 modulo 128 / D4, and the 128 / D4 partial
// sums of each dimension chunk are added in workgroup memory. Head size <=
// 128. The loops have constant trip counts and no branches around their
// loads (keys past the chunk are clamped and weigh 0), so that each
// thread has many loads in flight: the kernel is bound by load latency,
// not bandwidth.
// With the bindings of attention_step_io.wgsl (STEP), the kernel also does
// the rest of a decode step: it rotates the queries as it loads them, takes
// the new position (the last key) from the step's projection instead of
// the cache, and the first query head of each KV head writes that
// position's key (rotated) and value into the cache, for the later steps.

// Threads of a workgroup: rows.wgsl's ROW_THREADS, which the launcher
// sets to 256 where one workgroup takes every key of its row (at most
// 256), so that each thread loads one round of keys and one of values, and
// to 128 where the keys are split. The query is loaded before the first
// round of keys and values: issuing the three loads together is slower
// (docs/tuning.md, "Decode attention workgroup").
override THREADS: u32 = ROW_THREADS;
const MAX_CHUNK: u32 = 256u;

override FINAL: bool = false;
override OUT_DT: u32 = 0u;
// vec4 chunks of a head: ceil(head size / 4)
override D4: u32 = 16u;
// keys per thread and step of the weighted sum of values
const UNROLL: u32 = 8u;
// The head size is a multiple of 4 (set by the launcher; always so with
// STEP): every chunk is whole, and the loads of keys and values have no
// length test, so that they wait for one another less (docs/tuning.md,
// "Decode attention workgroup").
override WHOLE: bool = false;
// lanes that share a key's dot product in scores_sg.wgsl (unused by the
// tree form)
override KL: u32 = 1u;

// Dimensions in chunk c of a head.
fn head_chunk(c: u32) -> u32 {
    if STEP || WHOLE {
        return 4u;
    }
    return chunk_len(c, p.d);
}

var<workgroup> qsh: array<vec4<f32>, 64>;
var<workgroup> score: array<f32, MAX_CHUNK>;
var<workgroup> acc_sh: array<vec4<f32>, THREADS>;

// The new key's dot product with the query (STEP), from its parts by
// dimension chunk in acc_sh.
fn fresh_dot() -> f32 {
    var x = 0.0;
    for (var c = 0u; c < D4; c++) {
        x += acc_sh[c].x;
    }
    return x;
}

// The score of key t of the chunk from its dot product with the (scaled)
// query: the mask added, NEG_INF past the chunk's n keys.
fn finish_score(t: u32, n: u32, m0: u32, begin: u32, qk: f32) -> f32 {
    var x = capped(qk);
    if HAS_MASK {
        x += elem(MASK, m0 + (begin + min(t, max(n, 1u) - 1u)) * p.sm.w);
    }
    return select(NEG_INF, max(x, NEG_INF), t < n);
}

@compute @workgroup_size(THREADS)
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
    let d4 = D4;

    var visible = p.tk;
    if p.causal != 0u {
        visible = i + (p.tk - p.tq) + 1u;
    }
    let begin = chunk * p.chunk;
    let n = min(begin + p.chunk, visible) - min(begin, visible);
    let k0 = p.off_k + b * p.sk.x + kvh * p.sk.z;
    let v0 = p.off_v + b * p.sv.x + kvh * p.sv.z;
    let m0 = p.off_m + b * p.sm.x + h * p.sm.y + i * p.sm.z;
    // STEP: this chunk holds the new key (the last one), at t = n - 1
    let fresh = STEP && n > 0u && begin + n == p.tk;
    let cached = select(n, n - 1u, fresh);

    let q0 = p.off_q + b * p.sq.x + i * p.sq.y + h * p.sq.z;
    if lid < d4 {
        if STEP {
            let qc = step_q4(q0, lid) * p.scale;
            qsh[lid] = qc;
            if fresh {
                // the new key's score by dimension chunk (acc_sh is free
                // until the weighted sum of values)
                let kc = step_k4(kvh, lid);
                acc_sh[lid] = vec4<f32>(dot(qc, kc));
                if h % (p.heads / p.kv_heads) == 0u {
                    let last = p.tk - 1u;
                    step_store(p.off_k + b * p.sk.x + last * p.sk.y + kvh * p.sk.z + 4u * lid, kc);
                    step_store(p.off_v + b * p.sv.x + last * p.sv.y + kvh * p.sv.z + 4u * lid, step_v4(kvh, lid));
                }
            }
        } else {
            qsh[lid] = ld4(Q, q0 + 4u * lid * p.sq.w, chunk_len(lid, p.d), p.sq.w) * p.scale;
        }
    }
    workgroupBarrier();

    key_scores(lid, n, k0, m0, begin, fresh);
    workgroupBarrier();
    var m = NEG_INF;
    for (var t = lid; t < n; t += THREADS) {
        m = max(m, score[t]);
    }
    m = workgroup_max(m, lid);
    // weights; a hidden key (at most NEG_INF) weighs nothing
    var l = 0.0;
    for (var t = lid; t < MAX_CHUNK; t += THREADS) {
        // slots past the chunk's keys may not have been written
        let x = select(NEG_INF, score[t], t < n);
        let w = select(0.0, exp(x - m), x > NEG_INF);
        score[t] = w;
        l += w;
    }
    l = workgroup_sum(l, lid);

    // dimension chunk c of the keys t ≡ grp (mod groups)
    let groups = THREADS / d4;
    let c = lid % d4;
    let grp = lid / d4;
    var y = vec4<f32>(0.0);
    if grp < groups {
        for (var t0 = grp; t0 < cached; t0 += groups * UNROLL) {
            for (var u = 0u; u < UNROLL; u++) {
                let t = t0 + u * groups;
                let ok = t < cached;
                let tt = select(t0, t, ok);
                let vr = v0 + (begin + tt) * p.sv.y;
                let w = select(0.0, score[tt], ok);
                y = fma(vec4<f32>(w), ld4(V, vr + 4u * c * p.sv.w, head_chunk(c), p.sv.w), y);
            }
        }
    }
    if fresh && grp == 0u {
        y = fma(vec4<f32>(score[n - 1u]), step_v4(kvh, c), y);
    }
    acc_sh[lid] = y;
    workgroupBarrier();
    if lid >= d4 {
        return;
    }
    for (var k = 1u; k < groups; k++) {
        y += acc_sh[k * d4 + lid];
    }
    let out0 = g * p.record;
    if FINAL {
        // no visible key: NaN, as in attention_combine.wgsl
        y = select(y / l, vec4<f32>(bitcast<f32>(0x7fc00000u)), l == 0.0);
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
        return;
    }
    let e = out0 + 4u + 4u * lid;
    dst[e] = bitcast<u32>(y.x);
    dst[e + 1u] = bitcast<u32>(y.y);
    dst[e + 2u] = bitcast<u32>(y.z);
    dst[e + 3u] = bitcast<u32>(y.w);
    if lid == 0u {
        dst[out0] = bitcast<u32>(m);
        dst[out0 + 1u] = bitcast<u32>(l);
    }
}
