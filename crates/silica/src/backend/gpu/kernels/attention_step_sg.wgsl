// attention_step_sg.wgsl — one decode step of attention over a KV cache,
// a workgroup a query head (or a chunk of its keys), with
// attention_step_io.wgsl's operands and parameters: the queries and the
// new key rotated as they are loaded, the new position's key and value
// written to the cache by the first query head of each KV head, and the
// output row written in DT.
//
// Where decode_attention.wgsl stages the scores in workgroup memory and
// reduces them with barriers between its phases, this kernel has one
// barrier. A key's D dimensions are split over LK lanes of a subgroup, 16
// bytes each (one vec4 load), so that its score is a butterfly of
// shuffles among those lanes. Each thread keeps an online softmax over
// its keys (maximum m, sum of weights l, weighted sum y of its 16 bytes
// of the values); threads with the same dimensions merge their states by
// shuffles within a subgroup, then through workgroup memory across
// subgroups. Keys and values are loaded U rounds at a time: the first
// rounds before the query (they do not wait for it), the next ones before
// the scores of the current ones.
//
// Half of decode_attention.wgsl's cost above an empty dispatch is its
// phases and barriers, half its loads waiting for the query; this kernel
// removes most of both, and takes less GPU time than it at every cache
// length measured, whole or split into chunks (see `sg_chunks` in nn.rs
// for the chunk sizes; docs/tuning.md, "Subgroup attention step").
//
// A long cache is split over p.chunks workgroups a head, p.chunk keys
// each: each writes its state, (m, l, 2 unused words, y) in f32 words, as
// decode_attention.wgsl's chunks do, for attention_combine.wgsl to merge
// (`dst` is then that pass's scratch buffer). The first chunk's
// workgroups write the new key and value to the cache; no workgroup
// reads that row from the cache.
//
// The launcher (nn.rs `step_sg_lanes`) checks: a head size whose 16-byte
// chunks number LK, a power of two no wider than a subgroup, each half of
// a head whole chunks, and every offset a multiple of 16 bytes. A step has
// one query row per sequence. Subgroups are taken to be runs of
// consecutive local indices, as rows_sg.wgsl takes them.

// The bindings come from attention_step_sg_io.wgsl (one sequence) or
// attention_step_sg_batch_io.wgsl (p.batch sequences, one new position
// each, each with its own run of cache rows and key count).

// pairs (2i, 2i + 1) when set, (i, i + D / 2) otherwise
override ADJACENT: bool = false;
// lanes a key: the head's 16-byte chunks
override LK: u32 = 8u;

const THREADS: u32 = 256u;
// rounds of keys whose loads are in flight together
const U: u32 = 4u;
// Per subgroup, the merged state of each chunk of dimensions ([subgroup]
// [chunk], at most THREADS entries since a subgroup holds LK lanes or
// more): m, l and the 8 dimensions (4 for f32) of y.
var<workgroup> merged: array<array<f32, 10>, THREADS>;

// f32 with 32 bytes a lane (two words): for heads whose 16-byte chunks
// outnumber a subgroup (Gemma 3's 256 in f32).
override WIDE: bool = false;

// Elements of DT a lane takes: 16 bytes of them, 32 with WIDE.
fn chunk_elems() -> u32 {
    if DT == 0u && !WIDE {
        return 4u;
    }
    return 8u;
}

// A lane's elements from element e of src_q.
fn q_elems(e: u32) -> array<vec4<f32>, 2> {
    if WIDE {
        return array<vec4<f32>, 2>(bitcast<vec4<f32>>(src_q[e / 4u]), bitcast<vec4<f32>>(src_q[e / 4u + 1u]));
    }
    return unpack16(src_q[e / chunk_elems()]);
}

// A lane's elements of a key or value from its loaded words (`b` is the
// second word, used with WIDE).
fn lane_elems(a: vec4<u32>, b: vec4<u32>) -> array<vec4<f32>, 2> {
    if WIDE {
        return array<vec4<f32>, 2>(bitcast<vec4<f32>>(a), bitcast<vec4<f32>>(b));
    }
    return unpack16(a);
}

// Writes a lane's elements at element e of the cache.
fn store_cache(e: u32, c: array<vec4<f32>, 2>) {
    if WIDE {
        cache[e / 4u] = bitcast<vec4<u32>>(c[0]);
        cache[e / 4u + 1u] = bitcast<vec4<u32>>(c[1]);
    } else {
        cache[e / chunk_elems()] = pack16(c);
    }
}

// 16 bytes of DT as f32: elements 0-3 in [0], 4-7 in [1] (zeros for f32).
fn unpack16(w: vec4<u32>) -> array<vec4<f32>, 2> {
    if DT == 0u {
        return array<vec4<f32>, 2>(bitcast<vec4<f32>>(w), vec4<f32>(0.0));
    }
    if DT == 1u {
        return array<vec4<f32>, 2>(
            vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
            vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
        );
    }
    let lo = bitcast<vec4<f32>>(w << vec4<u32>(16u));
    let hi = bitcast<vec4<f32>>(w & vec4<u32>(0xffff0000u));
    return array<vec4<f32>, 2>(vec4<f32>(lo.x, hi.x, lo.y, hi.y), vec4<f32>(lo.z, hi.z, lo.w, hi.w));
}

// The inverse of unpack16, rounding to nearest even.
fn pack16(c: array<vec4<f32>, 2>) -> vec4<u32> {
    if DT == 0u {
        return bitcast<vec4<u32>>(c[0]);
    }
    return vec4<u32>(
        encode_pair(c[0].x, c[0].y, DT),
        encode_pair(c[0].z, c[0].w, DT),
        encode_pair(c[1].x, c[1].y, DT),
        encode_pair(c[1].z, c[1].w, DT),
    );
}

fn dot16(a: array<vec4<f32>, 2>, b: array<vec4<f32>, 2>) -> f32 {
    return dot(a[0], b[0]) + dot(a[1], b[1]);
}

// Chunk j of the head that starts at element `head` of src_q, rotated by
// the new position's angles and rounded to DT, as the separate rope
// kernel's output would hold it.
fn rotated(head: u32, j: u32, ang: u32) -> array<vec4<f32>, 2> {
    let n = chunk_elems();
    let e0 = n * j;
    let x = q_elems(head + e0);
    var r: array<vec4<f32>, 2>;
    if ADJACENT {
        let i0 = e0 / 2u;
        for (var k = 0u; k < n / 2u; k++) {
            let c = cos_t[p.sm.y + ang + i0 + k];
            let s = sin_t[p.sm.z + ang + i0 + k];
            let a = x[k / 2u][2u * (k % 2u)];
            let b = x[k / 2u][2u * (k % 2u) + 1u];
            r[k / 2u][2u * (k % 2u)] = a * c - b * s;
            r[k / 2u][2u * (k % 2u) + 1u] = b * c + a * s;
        }
    } else {
        // the chunk and its partner lie in opposite halves
        let half = p.d / 2u;
        let first = e0 < half;
        let i0 = select(e0 - half, e0, first);
        let y = q_elems(head + select(e0 - half, e0 + half, first));
        for (var k = 0u; k < n; k++) {
            let c = cos_t[p.sm.y + ang + i0 + k];
            let s = sin_t[p.sm.z + ang + i0 + k];
            let a = x[k / 4u][k % 4u];
            let b = y[k / 4u][k % 4u];
            r[k / 4u][k % 4u] = select(a * c + b * s, a * c - b * s, first);
        }
    }
    if DT == 0u {
        return r;
    }
    return unpack16(pack16(r));
}

// Online softmax state of one thread: maximum score m, sum of weights l,
// weighted sum y of its chunk of the values.
struct State {
    m: f32,
    l: f32,
    y: array<vec4<f32>, 2>,
}

// The state of a and b together.
fn merge(a: State, b: State) -> State {
    let m = max(a.m, b.m);
    // exp(NEG_INF - NEG_INF) is 1, and both l and y are 0 there
    let fa = exp(a.m - m);
    let fb = exp(b.m - m);
    var r: State;
    r.m = m;
    r.l = a.l * fa + b.l * fb;
    r.y[0] = a.y[0] * fa + b.y[0] * fb;
    r.y[1] = a.y[1] * fa + b.y[1] * fb;
    return r;
}

// The state of the lane `o` apart (xor) in the subgroup.
fn shuffled(s: State, o: u32) -> State {
    var r: State;
    r.m = subgroupShuffleXor(s.m, o);
    r.l = subgroupShuffleXor(s.l, o);
    r.y[0] = subgroupShuffleXor(s.y[0], o);
    r.y[1] = subgroupShuffleXor(s.y[1], o);
    return r;
}

// The words of keys t0 + u * slots + slot (u < U) and of their values:
// 16 bytes of each, from element k0 (v0) of its row (clamped to the last
// cached row).
struct Batch {
    k: array<vec4<u32>, U>,
    v: array<vec4<u32>, U>,
    // the second words (WIDE)
    k2: array<vec4<u32>, U>,
    v2: array<vec4<u32>, U>,
}

fn batch_words(t0: u32, slot: u32, slots: u32, k0: u32, v0: u32, cached_last: u32) -> Batch {
    let n = chunk_elems();
    var b: Batch;
    for (var u = 0u; u < U; u++) {
        let t = min(t0 + u * slots + slot, cached_last);
        let ek = k0 + t * p.sk.y;
        let ev = v0 + t * p.sv.y;
        if WIDE {
            b.k[u] = cache[ek / 4u];
            b.v[u] = cache[ev / 4u];
            b.k2[u] = cache[ek / 4u + 1u];
            b.v2[u] = cache[ev / 4u + 1u];
        } else {
            b.k[u] = cache[ek / n];
            b.v[u] = cache[ev / n];
        }
    }
    return b;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) width: u32) {
    let g = group_index(wid, nwg);
    // a whole workgroup leaves together, so the barrier stays in uniform
    // control flow
    if g >= p.batch * p.heads * p.chunks {
        return;
    }
    // sequence b, head h, chunk of keys
    let row = g / p.chunks;
    let b = row / p.heads;
    let h = row % p.heads;
    let chunk = g % p.chunks;
    let tk = seq_keys(b);
    let begin = chunk * p.chunk;
    // a chunk past this sequence's keys (a longer one set the count) has
    // none, and its record weighs nothing in the merge
    let end = min(begin + p.chunk, tk);
    let n = chunk_elems();
    let kvh = h / (p.heads / p.kv_heads);
    let j = lid % LK;
    let slot = lid / LK;
    let slots = THREADS / LK;
    let e0 = n * j;
    let last = tk - 1u;
    // cache rows 0..last - 1 (from the sequence's first row) hold the
    // earlier positions; the new one comes from src_q (clamped loads of a
    // first step read row 0, and drop it)
    let cached_last = max(last, 1u) - 1u;
    let first = seq_first(b);
    let k0 = p.off_k + first * p.sk.y + kvh * p.sk.z + e0;
    let v0 = p.off_v + first * p.sv.y + kvh * p.sv.z + e0;
    // the sequence's row of src_q and of the angle tables
    let qr = b * p.sq.y;
    let ang = b * (p.d / 2u);

    // the first round of keys and values is in flight before the query
    // is loaded, the next one before this one's scores are computed
    var next = batch_words(begin, slot, slots, k0, v0, cached_last);
    let q = rotated(p.off_q + qr + h * p.sq.z, j, ang);
    let kf = rotated(p.off_m + qr + kvh * p.sq.z, j, ang);
    let vf = q_elems(p.sm.x + qr + kvh * p.sq.z + e0);
    if h % (p.heads / p.kv_heads) == 0u && slot == 0u && chunk == 0u {
        store_cache(k0 + last * p.sk.y, kf);
        store_cache(v0 + last * p.sv.y, vf);
    }

    var st: State;
    st.m = NEG_INF;
    for (var t0 = begin; t0 < end; t0 += U * slots) {
        let cur = next;
        if t0 + U * slots < end {
            next = batch_words(t0 + U * slots, slot, slots, k0, v0, cached_last);
        }
        var s: array<f32, U>;
        var top = st.m;
        for (var u = 0u; u < U; u++) {
            let t = t0 + u * slots + slot;
            var k = lane_elems(cur.k[u], cur.k2[u]);
            if t == last {
                k = kf;
            }
            var x = dot16(q, k);
            for (var o = LK / 2u; o > 0u; o >>= 1u) {
                x += subgroupShuffleXor(x, o);
            }
            s[u] = select(NEG_INF, capped(x * p.scale), t < end);
            top = max(top, s[u]);
        }
        let f = exp(st.m - top);
        st.l *= f;
        st.y[0] *= f;
        st.y[1] *= f;
        st.m = top;
        for (var u = 0u; u < U; u++) {
            let t = t0 + u * slots + slot;
            var v = lane_elems(cur.v[u], cur.v2[u]);
            if t == last {
                v = vf;
            }
            // a key past the chunk's end weighs nothing, whatever its row
            // holds
            let live = t < end;
            let w = select(0.0, exp(s[u] - top), live);
            st.l += w;
            st.y[0] += w * select(vec4<f32>(0.0), v[0], live);
            st.y[1] += w * select(vec4<f32>(0.0), v[1], live);
        }
    }
    // the threads of a subgroup with the same chunk, then the subgroups
    for (var o = LK; o < width; o <<= 1u) {
        st = merge(st, shuffled(st, o));
    }
    let sg = lid / width;
    if lid % width < LK {
        merged[sg * LK + j] = array<f32, 10>(st.m, st.l, st.y[0].x, st.y[0].y, st.y[0].z, st.y[0].w, st.y[1].x, st.y[1].y, st.y[1].z, st.y[1].w);
    }
    workgroupBarrier();
    if lid >= LK {
        return;
    }
    var all: State;
    all.m = NEG_INF;
    for (var g = 0u; g < THREADS / width; g++) {
        let r = merged[g * LK + lid];
        var b: State;
        b.m = r[0];
        b.l = r[1];
        b.y[0] = vec4<f32>(r[2], r[3], r[4], r[5]);
        b.y[1] = vec4<f32>(r[6], r[7], r[8], r[9]);
        all = merge(all, b);
    }
    if p.chunks > 1u {
        // this chunk's record: m, l, two unused words, then y
        let r = g * (p.record / 4u);
        if lid == 0u {
            dst[r] = vec4<u32>(bitcast<u32>(all.m), bitcast<u32>(all.l), 0u, 0u);
        }
        dst[r + 1u + e0 / 4u] = bitcast<vec4<u32>>(all.y[0]);
        if DT != 0u || WIDE {
            dst[r + 2u + e0 / 4u] = bitcast<vec4<u32>>(all.y[1]);
        }
        return;
    }
    var out: array<vec4<f32>, 2>;
    out[0] = all.y[0] / all.l;
    out[1] = all.y[1] / all.l;
    if WIDE {
        dst[(row * p.d + e0) / 4u] = bitcast<vec4<u32>>(out[0]);
        dst[(row * p.d + e0) / 4u + 1u] = bitcast<vec4<u32>>(out[1]);
    } else {
        dst[(row * p.d + e0) / n] = pack16(out);
    }
}
