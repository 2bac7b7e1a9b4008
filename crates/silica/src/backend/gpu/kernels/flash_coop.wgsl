// flash_coop.wgsl — attention for many queries (prefill) of f16 q, k, v on
// cooperative matrices (16x16x16, f32 accumulation). A workgroup of 4
// subgroups of 32 takes BQ = 64 queries of one (batch, head), 16 rows per
// subgroup, and walks the keys in tiles of BK = 32. Per tile:
// - the workgroup copies the tile's keys into workgroup memory (kv), 8
//   halves per load (fetched during the previous tile), and each subgroup
//   scores its 16 rows against them as Sᵀ = k·qᵀ: 2 fragments of 16 keys,
//   k rows as the A operand from kv, qᵀ as B operands loaded once from q,
//   the fragments advanced together (independent products);
// - each subgroup stores Sᵀ column-major, that is S row-major, to its part
//   of sbuf, where each thread takes half a row (16 scores, 4 vec4 reads):
//   scale, causal and padding masks, the row's maximum (the two halves
//   swap theirs through a subgroup shuffle), then p = 2^(s - m) as f16,
//   written 4 at a time to pbuf; meanwhile the tile's values replace its
//   keys in kv;
// - each subgroup accumulates o += p·v into DF = D / 16 fragments (D up to
//   128), p read back as the A operand, v from kv, a fragment of p against
//   every fragment of o in turn.
// Four barriers a tile (five with the second of the flag's load): keys in
// kv; keys done (values may replace them, scores stored); values and
// probabilities in place (the load of the rescale flag); values done.
//
// Rows keep a reference maximum m for their exponentials; only when a
// tile's maximum exceeds it by more than SLACK2 (8 in natural units) is m
// moved and the accumulators rescaled (through workgroup memory, for the
// whole workgroup when any row needs it), so p <= e^8 stays well inside
// f16 and the round trip happens in the first tiles only. Scores are kept in base 2
// (scaled by log2 e) so that p is one exp2.
//
// The kernel waits more than it works: no single product or load is the
// cost, while its barriers and workgroup-memory traffic alone take a
// large share of the time. Hence four barriers a tile, the scores read
// and the probabilities written 4 at a time, the shuffles, the pitches of
// sbuf and pbuf (below), and 4 subgroups over tiles of 32 keys, whose
// smaller workgroup memory lets more workgroups share an SM; k and v are
// fetched a tile ahead although that holds more registers
// (docs/tuning.md, "Attention prefill").
//
// q fragments and k and v rows are read whole, so the launcher guarantees:
// Tq >= 16, Tk >= BK, head size a multiple of 16 (<= 128), q, k, v
// contiguous along the head and their offsets and strides multiples of 8
// elements (16 bytes). 23,312 bytes of workgroup memory. A
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
const BK: u32 = 32u;
// in base 2: p stays below e^8
const SLACK2: f32 = 8.0 * LOG2E;
const LOG2E: f32 = 1.442695;

// The tile's keys, then its values: [BK][PD] vec4<f16> slots, copied
// from k and v 8 halves at a time (halves8.wgsl) and read by the
// four subgroups as fragments. vec4<f16> is the widest pointer type a
// cooperative load reads correctly (see coop_tiles.wgsl).
var<workgroup> kv: array<vec4<f16>, BK * (4u * 8u + 2u)>; // PD at the largest DF
// Runs of 8 halves of a tile of keys or values per thread (NR_MAX at the
// largest DF)
const NR_MAX: u32 = 4u;
override NR: u32 = (BK * 2u * DF + 127u) / 128u;
// Row pitches of sbuf and pbuf in slots: BK and 4 floats (144 bytes), BK
// and 8 halves (80 bytes), so that the rows a fragment store or load
// touches at once fall on distinct banks (with tiles of 64 keys and
// unpadded rows of 256 and 128 bytes they all fell on the same ones).
const SP: u32 = 9u;
const PP: u32 = 10u;
// per subgroup [16][SP] vec4<f32> slots: the tile's scores, and the way
// out of the accumulators
var<workgroup> sbuf: array<vec4<f32>, BQ * SP>;
// per subgroup [16][PP] vec4<f16> slots: the tile's probabilities, A
// operand of p·v
var<workgroup> pbuf: array<vec4<f16>, BQ * PP>;
// per query row: the factor its accumulators are rescaled by, at the end its sum
var<workgroup> row_f: array<f32, BQ>;
// .x set when some row's accumulators must be rescaled. Every workgroup
// variable is a multiple of 16 bytes: NVIDIA's driver places them back to
// back, and a cooperative load from an address off 16 bytes reads from the
// address rounded down (a lone u32 here shifted pbuf's fragments by 2 halves)
var<workgroup> rescale: vec4<u32>;

// The 16 keys of the tile from slot `at` of kv on (keys by dimensions), an
// A operand.
fn k_rows(at: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&kv[at], PD);
}

// This thread's runs of the BK rows (keys) of k or v from element `at` on,
// `stride` elements apart: run lid + 128 i for i < NR, of 2·DF runs of 8
// halves per row (threads past the last run take it again). Fetched into
// registers ahead of their use (`put`).
fn fetch(at: u32, stride: u32, values: bool, lid: u32) -> array<mat2x4<f16>, NR_MAX> {
    let runs = 2u * DF;
    var out: array<mat2x4<f16>, NR_MAX>;
    for (var i = 0u; i < NR; i++) {
        let g = min(lid + 128u * i, BK * runs - 1u);
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
fn put(r: array<mat2x4<f16>, NR_MAX>, lid: u32) {
    let runs = 2u * DF;
    for (var i = 0u; i < NR; i++) {
        let g = min(lid + 128u * i, BK * runs - 1u);
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

// Sᵀ += k·qᵀ over dimensions 16f..16f+15 (qᵀ's fragment b) for the two
// fragments of 16 keys of the tile.
fn qk_step(f: u32, b: coop_mat16x16<f16, B>, s0: ptr<function, coop_mat16x16<f32, C>>, s1: ptr<function, coop_mat16x16<f32, C>>) {
    let at = 4u * f;
    *s0 = coopMultiplyAdd(k_rows(at), b, *s0);
    *s1 = coopMultiplyAdd(k_rows(at + 16u * PD), b, *s1);
}

// The values of keys 16kf..16kf+15 of the tile, dimensions from slot `at`
// on, a B operand.
fn v_rows(kf: u32, at: u32) -> coop_mat16x16<f16, B> {
    return coopLoadT<coop_mat16x16<f16, B>>(&kv[kf * 16u * PD + at], PD);
}

// o += p·v for keys 16kf..16kf+15 (p's fragment pk), every fragment of o.
fn pv_step(kf: u32, pk: coop_mat16x16<f16, A>, o0: ptr<function, coop_mat16x16<f32, C>>, o1: ptr<function, coop_mat16x16<f32, C>>, o2: ptr<function, coop_mat16x16<f32, C>>, o3: ptr<function, coop_mat16x16<f32, C>>, o4: ptr<function, coop_mat16x16<f32, C>>, o5: ptr<function, coop_mat16x16<f32, C>>, o6: ptr<function, coop_mat16x16<f32, C>>, o7: ptr<function, coop_mat16x16<f32, C>>) {
    *o0 = coopMultiplyAdd(pk, v_rows(kf, 0u), *o0);
    if DF > 1u {
        *o1 = coopMultiplyAdd(pk, v_rows(kf, 4u), *o1);
    }
    if DF > 2u {
        *o2 = coopMultiplyAdd(pk, v_rows(kf, 8u), *o2);
    }
    if DF > 3u {
        *o3 = coopMultiplyAdd(pk, v_rows(kf, 12u), *o3);
    }
    if DF > 4u {
        *o4 = coopMultiplyAdd(pk, v_rows(kf, 16u), *o4);
    }
    if DF > 5u {
        *o5 = coopMultiplyAdd(pk, v_rows(kf, 20u), *o5);
    }
    if DF > 6u {
        *o6 = coopMultiplyAdd(pk, v_rows(kf, 24u), *o6);
    }
    if DF > 7u {
        *o7 = coopMultiplyAdd(pk, v_rows(kf, 28u), *o7);
    }
}

// Fragment o with each row multiplied by its factor in row_f (the
// subgroup's rows from `rf` on).
fn rescaled(o: coop_mat16x16<f32, C>, sb: u32, rf: u32, lane: u32) -> coop_mat16x16<f32, C> {
    coopStoreT(o, &sbuf[sb], 4u);
    workgroupBarrier();
    // slots 2 lane, 2 lane + 1: row lane / 2
    let f = row_f[rf + lane / 2u];
    sbuf[sb + 2u * lane] *= f;
    sbuf[sb + 2u * lane + 1u] *= f;
    workgroupBarrier();
    let back = coopLoadT<coop_mat16x16<f32, C>>(&sbuf[sb], 4u);
    workgroupBarrier();
    return back;
}

// Writes fragment o (dimensions c0..c0+15 of rows qr..qr+15) divided by
// the rows' sums in row_f (from `rf` on), the rows from `own` on.
fn write_out(o: coop_mat16x16<f32, C>, c0: u32, sb: u32, rf: u32, lane: u32, qr: u32, own: u32, out0: u32) {
    coopStoreT(o, &sbuf[sb], 4u);
    workgroupBarrier();
    // slots 2 lane, 2 lane + 1: row lane / 2, dimensions 8 (lane % 2)..+8
    let i = qr + lane / 2u;
    if i >= own {
        let l = row_f[rf + lane / 2u];
        // no visible key: NaN, as on the CPU
        let nan = vec4<f32>(bitcast<f32>(0x7fc00000u));
        let inv = 1.0 / l;
        let y0 = select(sbuf[sb + 2u * lane] * inv, nan, l == 0.0);
        let y1 = select(sbuf[sb + 2u * lane + 1u] * inv, nan, l == 0.0);
        let at = out0 + i * p.heads * p.d + c0 + 8u * (lane % 2u);
        if OUT_DT == 1u || OUT_DT == 2u {
            let w = at >> 1u;
            dst[w] = encode_pair(y0.x, y0.y, OUT_DT);
            dst[w + 1u] = encode_pair(y0.z, y0.w, OUT_DT);
            dst[w + 2u] = encode_pair(y1.x, y1.y, OUT_DT);
            dst[w + 3u] = encode_pair(y1.z, y1.w, OUT_DT);
        } else {
            dst[at] = bitcast<u32>(y0.x);
            dst[at + 1u] = bitcast<u32>(y0.y);
            dst[at + 2u] = bitcast<u32>(y0.z);
            dst[at + 3u] = bitcast<u32>(y0.w);
            dst[at + 4u] = bitcast<u32>(y1.x);
            dst[at + 5u] = bitcast<u32>(y1.y);
            dst[at + 6u] = bitcast<u32>(y1.z);
            dst[at + 7u] = bitcast<u32>(y1.w);
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
    // the subgroup's slots of sbuf and pbuf, and its rows of row_f
    let sb = sg * 16u * SP;
    let pb = sg * 16u * PP;
    let rf = sg * 16u;
    // this thread's half row: row r of the subgroup's 16, keys 16 hh.. of a tile
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
    let scale2 = p.scale * LOG2E;
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
    if lid == 0u {
        rescale.x = 0u;
    }
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
        var s0 = coop_mat16x16<f32, C>();
        var s1 = s0;
        qk_step(0u, q0f, &s0, &s1);
        if DF > 1u {
            qk_step(1u, q1f, &s0, &s1);
        }
        if DF > 2u {
            qk_step(2u, q2f, &s0, &s1);
        }
        if DF > 3u {
            qk_step(3u, q3f, &s0, &s1);
        }
        if DF > 4u {
            qk_step(4u, q4f, &s0, &s1);
        }
        if DF > 5u {
            qk_step(5u, q5f, &s0, &s1);
        }
        if DF > 6u {
            qk_step(6u, q6f, &s0, &s1);
        }
        if DF > 7u {
            qk_step(7u, q7f, &s0, &s1);
        }
        // sᵀ stored column-major: the scores row-major, SP slots a row
        coopStore(s0, &sbuf[sb], SP);
        coopStore(s1, &sbuf[sb + 4u], SP);
        workgroupBarrier();
        // every subgroup is done with the keys: the values take their place
        put(rv, lid);
        let jn = min(select(j0, j0 + BK, j0 + BK < end), p.tk - BK);
        rk = fetch(k0 + jn * p.sk.y, p.sk.y, false, lid);

        // the half row's scores, base 2, masked (rows 8 apart take the
        // slots in an order one apart: with the pitches, the rows that a
        // load or store reaches at once fall on distinct banks)
        let row = sb + r * SP + hh * 4u;
        let c0 = jb + hh * 16u;
        var x: array<vec4<f32>, 4>;
        var mx = NEG_INF;
        for (var t = 0u; t < 4u; t++) {
            let c = (t + (r >> 3u)) & 3u;
            var v = sbuf[row + c] * scale2;
            let j = c0 + 4u * c;
            for (var e = 0u; e < 4u; e++) {
                if HAS_MASK {
                    let at = m0 + (j + e) * p.sm.w;
                    v[e] += decode(src_m[word_index(at, DT)], at, DT) * LOG2E;
                }
                // -inf (a hidden key) is kept as the lowest finite value
                let seen = j + e >= j0 && j + e < row_end;
                v[e] = select(NEG_INF, max(v[e], NEG_INF), seen);
            }
            x[t] = v;
            mx = max(mx, max(max(v.x, v.y), max(v.z, v.w)));
        }
        mx = max(mx, subgroupShuffleXor(mx, 16u));
        var alpha = 1.0;
        if mx > m + SLACK2 {
            alpha = exp2(m - mx);
            // accumulators that are still zero need no rescaling
            if m > NEG_INF {
                rescale.x = 1u;
            }
            m = mx;
            l *= alpha;
        }
        if hh == 0u {
            row_f[rf + r] = alpha;
        }
        let prow = pb + r * PP + hh * 4u;
        for (var t = 0u; t < 4u; t++) {
            let c = (t + (r >> 3u)) & 3u;
            let v = x[t];
            let pr = select(exp2(v - m), vec4<f32>(0.0), v <= vec4<f32>(NEG_INF));
            l += (pr.x + pr.y) + (pr.z + pr.w);
            pbuf[prow + c] = vec4<f16>(pr);
        }
        // the values are in kv, the probabilities in pbuf
        if workgroupUniformLoad(&rescale).x != 0u {
            o0 = rescaled(o0, sb, rf, lane);
            if DF > 1u {
                o1 = rescaled(o1, sb, rf, lane);
            }
            if DF > 2u {
                o2 = rescaled(o2, sb, rf, lane);
            }
            if DF > 3u {
                o3 = rescaled(o3, sb, rf, lane);
            }
            if DF > 4u {
                o4 = rescaled(o4, sb, rf, lane);
            }
            if DF > 5u {
                o5 = rescaled(o5, sb, rf, lane);
            }
            if DF > 6u {
                o6 = rescaled(o6, sb, rf, lane);
            }
            if DF > 7u {
                o7 = rescaled(o7, sb, rf, lane);
            }
            if lid == 0u {
                rescale.x = 0u;
            }
        }
        for (var kf = 0u; kf < 2u; kf++) {
            let pk = coopLoadT<coop_mat16x16<f16, A>>(&pbuf[pb + 4u * kf], PP);
            pv_step(kf, pk, &o0, &o1, &o2, &o3, &o4, &o5, &o6, &o7);
        }
        // every subgroup is done with the values before the next keys
        workgroupBarrier();
    }

    // the row's sum, both halves
    l += subgroupShuffleXor(l, 16u);
    if hh == 0u {
        row_f[rf + r] = l;
    }
    let out0 = (b * p.tq * p.heads + h) * p.d;
    write_out(o0, 0u, sb, rf, lane, qr, own, out0);
    if DF > 1u {
        write_out(o1, 16u, sb, rf, lane, qr, own, out0);
    }
    if DF > 2u {
        write_out(o2, 32u, sb, rf, lane, qr, own, out0);
    }
    if DF > 3u {
        write_out(o3, 48u, sb, rf, lane, qr, own, out0);
    }
    if DF > 4u {
        write_out(o4, 64u, sb, rf, lane, qr, own, out0);
    }
    if DF > 5u {
        write_out(o5, 80u, sb, rf, lane, qr, own, out0);
    }
    if DF > 6u {
        write_out(o6, 96u, sb, rf, lane, qr, own, out0);
    }
    if DF > 7u {
        write_out(o7, 112u, sb, rf, lane, qr, own, out0);
    }
}
