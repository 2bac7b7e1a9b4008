// flash_coop.wgsl — attention for many queries (prefill) of f16 q, k, v on
// cooperative matrices (16x16x16, f32 accumulation). A workgroup of 4
// subgroups of 32 takes BQ = 64 queries of one (batch, head), 16 rows per
// subgroup, and walks the keys in tiles of BK = 64. Per tile:
// - the workgroup copies the tile's keys into workgroup memory (kv), 8
//   halves per load (fetched during the previous tile), and each subgroup
//   scores its 16 rows against them as Sᵀ = k·qᵀ: 4 fragments of 16 keys,
//   k rows as the A operand from kv,
//   qᵀ as B operands loaded once from q (k read row by row was 6% faster
//   on an H100 than q·kᵀ with kᵀ read column by column);
// - each subgroup stores Sᵀ column-major, that is S row-major, to
//   workgroup memory, where each thread takes half a row (32 scores):
//   scale, causal and padding masks, the row's maximum (the two halves
//   swap theirs through workgroup memory), then p = exp(s - m) as f16 into
//   workgroup memory; meanwhile the tile's values replace its keys in kv;
// - each subgroup accumulates o += p·v into DF = D / 16 fragments (D up to
//   128), p read back as the A operand, v from kv.
// Rows keep a reference maximum m for their exponentials; only when a
// tile's maximum exceeds it by more than SLACK is m moved and the
// accumulators rescaled (through workgroup memory, for the whole workgroup
// when any row needs it), so p <= e^SLACK stays well inside f16 and the
// round trip happens in the first tiles only.
//
// q fragments and k and v rows are read whole, so the launcher guarantees:
// Tq >= 16, Tk >= BK, head size a multiple of 16 (<= 128), q, k, v
// contiguous along the head and their offsets and strides multiples of 8
// elements (16 bytes). 42,768 bytes of workgroup memory. A
// subgroup whose 16 rows cross Tq computes the last 16 instead and writes
// only its own; the last key tile is moved back to end at Tk and its keys
// already seen are hidden.
// Params from attention_params.wgsl.

@group(0) @binding(1) var<storage, read> src_q: array<f16>;
@group(0) @binding(2) var<storage, read> src_k: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> src_v: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> src_m: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<u32>;

override OUT_DT: u32 = 1u;
// head size / 16, 1..=8
override DF: u32 = 8u;
// Row pitch of the key tile in vec4<f16> slots: the head size and 8 halves
// (16 bytes), so that the 8 rows of a fragment load start on distinct banks.
override PD: u32 = 4u * DF + 2u;

const BQ: u32 = 64u;
const BK: u32 = 64u;
const SLACK: f32 = 8.0;

// The tile's keys, then its values: [BK][PD] vec4<f16> slots, copied
// from k and v 8 halves at a time (halves8.wgsl) and read by the
// four subgroups as fragments. vec4<f16> is the widest pointer type a
// cooperative load reads correctly (see coop_tiles.wgsl).
var<workgroup> kv: array<vec4<f16>, BK * (4u * 8u + 2u)>; // PD at the largest DF
// per subgroup [16][BK]: the tile's scores, and the way out of the accumulators
var<workgroup> sbuf: array<f32, 4096>;
// per subgroup [16][BK]: the tile's probabilities, A operand of p·v
var<workgroup> pbuf: array<f16, 4096>;
// per thread: its half row's maximum or sum, for the other half
var<workgroup> part: array<f32, 128>;
// per query row: the factor its accumulators are rescaled by, at the end its sum
var<workgroup> row_f: array<f32, 64>;
// .x set when some row's accumulators must be rescaled. Every workgroup
// variable is a multiple of 16 bytes: NVIDIA's driver places them back to
// back, and a cooperative load from an address off 16 bytes reads from the
// address rounded down (a lone u32 here shifted pbuf's fragments by 2 halves)
var<workgroup> rescale: vec4<u32>;

// Score of key j (column at `at` of sbuf) for a row that sees keys
// j0 <= j < row_end: scaled, masked, NEG_INF when hidden.
fn score(at: u32, j: u32, j0: u32, row_end: u32, m0: u32) -> f32 {
    var x = sbuf[at] * p.scale;
    if HAS_MASK {
        let e = m0 + j * p.sm.w;
        x += decode(src_m[word_index(e, DT)], e, DT);
    }
    // -inf (a hidden key) is kept as the lowest finite value
    return select(NEG_INF, max(x, NEG_INF), j >= j0 && j < row_end);
}

// The 16 keys of the tile from slot `at` of kv on (keys by dimensions), an
// A operand.
fn k_rows(at: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&kv[at], PD);
}

// This thread's runs of the BK rows (keys) of k or v from element `at` on,
// `stride` elements apart: run lid + 128 i for i < DF, of 2·DF runs of 8
// halves per row. Fetched into registers ahead of their use (`put`).
fn fetch(at: u32, stride: u32, values: bool, lid: u32) -> array<mat2x4<f16>, 8> {
    let runs = 2u * DF;
    var out: array<mat2x4<f16>, 8>;
    for (var i = 0u; i < DF; i++) {
        let g = lid + 128u * i;
        let e = (at + (g / runs) * stride + 8u * (g % runs)) >> 3u;
        if values {
            out[i] = halves8(src_v[e]);
        } else {
            out[i] = halves8(src_k[e]);
        }
    }
    return out;
}

// Stores the runs `fetch` returned into kv.
fn put(r: array<mat2x4<f16>, 8>, lid: u32) {
    let runs = 2u * DF;
    for (var i = 0u; i < DF; i++) {
        let g = lid + 128u * i;
        let t = (g / runs) * PD + 2u * (g % runs);
        kv[t] = r[i][0];
        kv[t + 1u] = r[i][1];
    }
}

// The 16 rows of q from element `at` on, transposed (dimensions by
// queries: element (d, i) at i·stride + d), a B operand.
fn q_cols(at: u32) -> coop_mat16x16<f16, B> {
    return coopLoad<coop_mat16x16<f16, B>>(&src_q[at], p.sq.y);
}

// s + k·qᵀ for the 16 keys whose row starts at slot `at` of kv; b0..b7
// hold qᵀ, 16 dimensions each.
fn qk(s: coop_mat16x16<f32, C>, at: u32, b0: coop_mat16x16<f16, B>, b1: coop_mat16x16<f16, B>, b2: coop_mat16x16<f16, B>, b3: coop_mat16x16<f16, B>, b4: coop_mat16x16<f16, B>, b5: coop_mat16x16<f16, B>, b6: coop_mat16x16<f16, B>, b7: coop_mat16x16<f16, B>) -> coop_mat16x16<f32, C> {
    var acc = coopMultiplyAdd(k_rows(at), b0, s);
    if DF > 1u {
        acc = coopMultiplyAdd(k_rows(at + 4u), b1, acc);
    }
    if DF > 2u {
        acc = coopMultiplyAdd(k_rows(at + 8u), b2, acc);
    }
    if DF > 3u {
        acc = coopMultiplyAdd(k_rows(at + 12u), b3, acc);
    }
    if DF > 4u {
        acc = coopMultiplyAdd(k_rows(at + 16u), b4, acc);
    }
    if DF > 5u {
        acc = coopMultiplyAdd(k_rows(at + 20u), b5, acc);
    }
    if DF > 6u {
        acc = coopMultiplyAdd(k_rows(at + 24u), b6, acc);
    }
    if DF > 7u {
        acc = coopMultiplyAdd(k_rows(at + 28u), b7, acc);
    }
    return acc;
}

// o + p·v over the 64 keys of a tile, for the 16 dimensions of v from
// slot `at` of kv on (the values are staged there).
fn pv(o: coop_mat16x16<f32, C>, p0: coop_mat16x16<f16, A>, p1: coop_mat16x16<f16, A>, p2: coop_mat16x16<f16, A>, p3: coop_mat16x16<f16, A>, at: u32) -> coop_mat16x16<f32, C> {
    let a1 = at + 16u * PD;
    let a2 = a1 + 16u * PD;
    let a3 = a2 + 16u * PD;
    var acc = coopMultiplyAdd(p0, coopLoadT<coop_mat16x16<f16, B>>(&kv[at], PD), o);
    acc = coopMultiplyAdd(p1, coopLoadT<coop_mat16x16<f16, B>>(&kv[a1], PD), acc);
    acc = coopMultiplyAdd(p2, coopLoadT<coop_mat16x16<f16, B>>(&kv[a2], PD), acc);
    return coopMultiplyAdd(p3, coopLoadT<coop_mat16x16<f16, B>>(&kv[a3], PD), acc);
}

// Fragment o with each row multiplied by its factor in row_f.
fn rescaled(o: coop_mat16x16<f32, C>, sb: u32, sg: u32, lane: u32) -> coop_mat16x16<f32, C> {
    coopStoreT(o, &sbuf[sb], 16u);
    workgroupBarrier();
    for (var t = 0u; t < 8u; t++) {
        let e = lane * 8u + t;
        sbuf[sb + e] *= row_f[sg * 16u + e / 16u];
    }
    workgroupBarrier();
    let back = coopLoadT<coop_mat16x16<f32, C>>(&sbuf[sb], 16u);
    workgroupBarrier();
    return back;
}

// Writes fragment o (dimensions c0..c0+15 of rows qr..qr+15) divided by
// the rows' sums in row_f, the rows from `own` on.
fn write_out(o: coop_mat16x16<f32, C>, c0: u32, sb: u32, sg: u32, lane: u32, qr: u32, own: u32, out0: u32) {
    coopStoreT(o, &sbuf[sb], 16u);
    workgroupBarrier();
    for (var t = 0u; t < 8u; t += 2u) {
        let e = lane * 8u + t;
        let i = qr + e / 16u;
        if i >= own {
            let l = row_f[sg * 16u + e / 16u];
            // no visible key: NaN, as on the CPU
            let nan = bitcast<f32>(0x7fc00000u);
            let y0 = select(sbuf[sb + e] / l, nan, l == 0.0);
            let y1 = select(sbuf[sb + e + 1u] / l, nan, l == 0.0);
            let at = out0 + i * p.heads * p.d + c0 + e % 16u;
            if OUT_DT == 1u || OUT_DT == 2u {
                dst[at >> 1u] = encode_pair(y0, y1, OUT_DT);
            } else {
                dst[at] = bitcast<u32>(y0);
                dst[at + 1u] = bitcast<u32>(y1);
            }
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let blocks = (p.tq + BQ - 1u) / BQ;
    // cooperative operations need every workgroup to go on: one past the
    // grid's blocks (a padded grid) computes the last block and writes nothing
    let total = p.batch * p.heads * blocks;
    let g = min(group_index(wid, nwg), total - 1u);
    let idle = group_index(wid, nwg) >= total;
    // the longest (causal) blocks first
    let qb = blocks - 1u - g % blocks;
    let h = (g / blocks) % p.heads;
    let b = g / (blocks * p.heads);
    let kvh = h / (p.heads / p.kv_heads);
    let sg = lid / 32u;
    let lane = lid % 32u;
    // the first row this subgroup writes, and the first it computes
    let own = select(qb * BQ + sg * 16u, 0xffffffffu, idle);
    let qr = min(qb * BQ + sg * 16u, p.tq - 16u);
    let sb = sg * 1024u;
    // this thread's half row: row r of the subgroup's 16, keys hh·32.. of a tile
    let r = lane % 16u;
    let hh = lane / 16u;
    let i = qr + r;
    let shift = p.tk - p.tq;
    // keys below `end` are visible to some query of the block, keys below
    // `row_end` to this thread's
    var end = p.tk;
    var row_end = p.tk;
    if p.causal != 0u {
        end = min(p.tk, min(qb * BQ + BQ, p.tq) + shift);
        row_end = i + shift + 1u;
    }
    let q0 = p.off_q + b * p.sq.x + h * p.sq.z + qr * p.sq.y;
    let k0 = p.off_k + b * p.sk.x + kvh * p.sk.z;
    let v0 = p.off_v + b * p.sv.x + kvh * p.sv.z;
    let m0 = p.off_m + b * p.sm.x + h * p.sm.y + i * p.sm.z;
    // qᵀ as B operands, once
    let q0f = q_cols(q0);
    var q1f = q0f;
    var q2f = q0f;
    var q3f = q0f;
    var q4f = q0f;
    var q5f = q0f;
    var q6f = q0f;
    var q7f = q0f;
    if DF > 1u {
        q1f = q_cols(q0 + 16u);
    }
    if DF > 2u {
        q2f = q_cols(q0 + 32u);
    }
    if DF > 3u {
        q3f = q_cols(q0 + 48u);
    }
    if DF > 4u {
        q4f = q_cols(q0 + 64u);
    }
    if DF > 5u {
        q5f = q_cols(q0 + 80u);
    }
    if DF > 6u {
        q6f = q_cols(q0 + 96u);
    }
    if DF > 7u {
        q7f = q_cols(q0 + 112u);
    }
    var m = NEG_INF;
    var l = 0.0;
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    var o4 = coop_mat16x16<f32, C>();
    var o5 = coop_mat16x16<f32, C>();
    var o6 = coop_mat16x16<f32, C>();
    var o7 = coop_mat16x16<f32, C>();
    // the first tile's keys; each tile then fetches its values before its
    // scores and the next tile's keys before its products with v (the last
    // tile its own keys again), so that the loads are in flight meanwhile
    var rk = fetch(k0, p.sk.y, false, lid);
    for (var j0 = 0u; j0 < end; j0 += BK) {
        // the tile's keys: jb.., moved back to end at Tk
        let jb = min(j0, p.tk - BK);
        put(rk, lid);
        workgroupBarrier();
        let rv = fetch(v0 + jb * p.sv.y, p.sv.y, true, lid);
        let z = coop_mat16x16<f32, C>();
        let s0 = qk(z, 0u, q0f, q1f, q2f, q3f, q4f, q5f, q6f, q7f);
        let s1 = qk(z, 16u * PD, q0f, q1f, q2f, q3f, q4f, q5f, q6f, q7f);
        let s2 = qk(z, 32u * PD, q0f, q1f, q2f, q3f, q4f, q5f, q6f, q7f);
        let s3 = qk(z, 48u * PD, q0f, q1f, q2f, q3f, q4f, q5f, q6f, q7f);
        let t1 = sb + 16u;
        let t2 = sb + 32u;
        let t3 = sb + 48u;
        // sᵀ stored column-major: the scores row-major
        coopStore(s0, &sbuf[sb], BK);
        coopStore(s1, &sbuf[t1], BK);
        coopStore(s2, &sbuf[t2], BK);
        coopStore(s3, &sbuf[t3], BK);
        workgroupBarrier();
        // every subgroup is done with the keys: the values take their place
        put(rv, lid);
        let jn = min(select(j0, j0 + BK, j0 + BK < end), p.tk - BK);
        rk = fetch(k0 + jn * p.sk.y, p.sk.y, false, lid);
        if lid == 0u {
            rescale.x = 0u;
        }

        // the row's largest visible score in the tile (columns visited in
        // a rotated order: the 16 rows of a half hit 16 different banks)
        let row = sb + r * BK + hh * 32u;
        let c0 = jb + hh * 32u;
        var mx = NEG_INF;
        for (var t = 0u; t < 32u; t++) {
            let c = (t + r) & 31u;
            mx = max(mx, score(row + c, c0 + c, j0, row_end, m0));
        }
        part[lid] = mx;
        workgroupBarrier();
        mx = max(mx, part[lid ^ 16u]);
        var alpha = 1.0;
        if mx > m + SLACK {
            alpha = exp(m - mx);
            // accumulators that are still zero need no rescaling
            if m > NEG_INF {
                rescale.x = 1u;
            }
            m = mx;
            l *= alpha;
        }
        if hh == 0u {
            row_f[sg * 16u + r] = alpha;
        }
        for (var t = 0u; t < 32u; t++) {
            let c = (t + r) & 31u;
            let x = score(row + c, c0 + c, j0, row_end, m0);
            let pr = select(exp(x - m), 0.0, x <= NEG_INF);
            l += pr;
            pbuf[row + c] = f16(pr);
        }
        // the values are in kv (and the probabilities in pbuf)
        workgroupBarrier();
        if workgroupUniformLoad(&rescale).x != 0u {
            o0 = rescaled(o0, sb, sg, lane);
            if DF > 1u {
                o1 = rescaled(o1, sb, sg, lane);
            }
            if DF > 2u {
                o2 = rescaled(o2, sb, sg, lane);
            }
            if DF > 3u {
                o3 = rescaled(o3, sb, sg, lane);
            }
            if DF > 4u {
                o4 = rescaled(o4, sb, sg, lane);
            }
            if DF > 5u {
                o5 = rescaled(o5, sb, sg, lane);
            }
            if DF > 6u {
                o6 = rescaled(o6, sb, sg, lane);
            }
            if DF > 7u {
                o7 = rescaled(o7, sb, sg, lane);
            }
        }

        let p0 = coopLoadT<coop_mat16x16<f16, A>>(&pbuf[sb], BK);
        let p1 = coopLoadT<coop_mat16x16<f16, A>>(&pbuf[t1], BK);
        let p2 = coopLoadT<coop_mat16x16<f16, A>>(&pbuf[t2], BK);
        let p3 = coopLoadT<coop_mat16x16<f16, A>>(&pbuf[t3], BK);
        o0 = pv(o0, p0, p1, p2, p3, 0u);
        if DF > 1u {
            o1 = pv(o1, p0, p1, p2, p3, 4u);
        }
        if DF > 2u {
            o2 = pv(o2, p0, p1, p2, p3, 8u);
        }
        if DF > 3u {
            o3 = pv(o3, p0, p1, p2, p3, 12u);
        }
        if DF > 4u {
            o4 = pv(o4, p0, p1, p2, p3, 16u);
        }
        if DF > 5u {
            o5 = pv(o5, p0, p1, p2, p3, 20u);
        }
        if DF > 6u {
            o6 = pv(o6, p0, p1, p2, p3, 24u);
        }
        if DF > 7u {
            o7 = pv(o7, p0, p1, p2, p3, 28u);
        }
        // every subgroup is done with the values before the next keys
        workgroupBarrier();
    }

    // the row's sum, both halves
    part[lid] = l;
    workgroupBarrier();
    if hh == 0u {
        row_f[sg * 16u + r] = l + part[lid ^ 16u];
    }
    let out0 = (b * p.tq * p.heads + h) * p.d;
    write_out(o0, 0u, sb, sg, lane, qr, own, out0);
    if DF > 1u {
        write_out(o1, 16u, sb, sg, lane, qr, own, out0);
    }
    if DF > 2u {
        write_out(o2, 32u, sb, sg, lane, qr, own, out0);
    }
    if DF > 3u {
        write_out(o3, 48u, sb, sg, lane, qr, own, out0);
    }
    if DF > 4u {
        write_out(o4, 64u, sb, sg, lane, qr, own, out0);
    }
    if DF > 5u {
        write_out(o5, 80u, sb, sg, lane, qr, own, out0);
    }
    if DF > 6u {
        write_out(o6, 96u, sb, sg, lane, qr, own, out0);
    }
    if DF > 7u {
        write_out(o7, 112u, sb, sg, lane, qr, own, out0);
    }
}
