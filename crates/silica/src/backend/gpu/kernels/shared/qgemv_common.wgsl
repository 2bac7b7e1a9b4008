// qgemv_common.wgsl — what the GEMV kernels of the quantized formats
// share (qgemv.wgsl, qgemv_i8.wgsl): bindings, specialization, the fusions
// and the final sum over a lane set with the writes of its columns.
//
// Fusions (override constants), in the order they apply:
// - NORM: x is replaced by rms_norm(x) * g. Every workgroup sums the
//   squares of the M rows itself (x is small and stays in cache), scales x
//   by g as it loads it and the sums by 1 / rms at the end.
// - LORA (a rank): u [M, LORA] (f32) @ b [LORA, rows of w] (x's dtype) is
//   added to the product, before the SwiGLU: a low-rank update whose
//   first half (u) an earlier kernel computed, or with LORA_IN this one:
//   src_lu then holds a [LORA, K] (x's dtype, the norm's weight folded
//   in) and every workgroup computes x @ aᵀ for its rows itself (a few
//   thousand products), which saves a dependent dispatch. It does so
//   before the weights' products, with its first words of `a` loaded as
//   the kernel starts, and each lane's words of `b` too where they fit
//   (the adapter's weights are cold: a load at the end would add its
//   latency to the kernel's).
// - SWIGLU: w holds gate [N, K] then up [N, K]; a lane set takes R / 2
//   columns of each and writes silu(gate) * up, or with GELU
//   gelu_tanh(gate) * up (GeGLU).
// - RESIDUAL: the residual r [M, N] (dtype RES_DT) is added.
//
// A product of more rows than M (up to 64: a short prompt, a server's step
// of many sequences) runs in chunks of M rows, chunk z in the workgroups
// of grid row z: rows z M .. z M + M - 1 of x, the residual and the
// low-rank u, where those past p.m repeat the last row and write nothing.

@group(0) @binding(0) var<uniform> p: QParams;
@group(0) @binding(1) var<storage, read> src_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_w: array<u32>;
@group(0) @binding(3) var<storage, read> src_g: array<u32>;
@group(0) @binding(4) var<storage, read> src_r: array<u32>;
// the blocks again, 16 bytes an element: whole aligned runs of them in one
// load each (qgemv_i8.wgsl's K formats)
@group(0) @binding(5) var<storage, read> src_w4: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> src_lu: array<u32>;
@group(0) @binding(7) var<storage, read> src_lb: array<u32>;
@group(0) @binding(8) var<storage, read_write> dst: array<u32>;

override M: u32 = 1u;
override LANES: u32 = 32u;
// Weight rows per lane set; R * M <= 16 (the accumulators) and <= SLOTS.
override R: u32 = 1u;
override NORM: bool = false;
override SWIGLU: bool = false;
override GELU: bool = false;
override RESIDUAL: bool = false;
override LORA: u32 = 0u;
override LORA_IN: bool = false;
// lora_u's length, M * LORA with LORA_IN (a named override, as PARTIAL)
override LORA_U: u32 = 1u;
// Output columns per lane set: R, or R / 2 with SWIGLU.
override OC: u32 = 1u;
// dtype code of the residual (the norm weight has x's dtype)
override RES_DT: u32 = 0u;

// Slots of 256 f32 in `partial`: 8, or R * M where that is more (the
// final sum holds one slot an accumulator).
override SLOTS: u32 = 8u;
// partial's length: a named override, since naga cannot set the unnamed
// one that an array length of SLOTS * WG would make before the overrides
// declared after it
override PARTIAL: u32 = SLOTS * WG;

var<workgroup> partial: array<f32, PARTIAL>; // [SLOTS][256]

// The first row of x (of the whole product) of this workgroup's chunk:
// set by `start_chunk`.
var<private> row0: u32;

// Sets row0 from the workgroup's grid row.
fn start_chunk(wid: vec3<u32>) {
    row0 = wid.z * M;
}

// Row r of this chunk as a row of the whole product, clamped to the last.
fn x_row(r: u32) -> u32 {
    return min(row0 + r, p.m - 1u);
}
var<workgroup> inv_rms: array<f32, 8>;
// With LORA_IN: u [M, LORA] of the chunk's rows, before the norm's 1 / rms.
var<workgroup> lora_u: array<f32, LORA_U>;

// Sums of squares of x's rows (for NORM), one a row; a thread's own.
alias RowSums = array<f32, 8>;

// Publishes 1 / rms of each of the M rows of x in inv_rms, from every
// thread's sums of squares `ss`: a tree in `partial`, one slot a row.
fn publish_rms(lid: u32, ss: RowSums) {
    for (var r = 0u; r < M; r++) {
        partial[r * WG + lid] = ss[r];
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
    // the lane sums write `partial` next
    workgroupBarrier();
}

// A lane's accumulators: acc[c * M + r] for weight row c and row r of x.
alias Accs = array<f32, 16>;

// Norm weight elements e..e+3 (e a multiple of 4, off_g a multiple of 8).
fn g4(e: u32) -> vec4<f32> {
    let i = p.off_g + e;
    if IN_DT == 0u {
        return vec4<f32>(bitcast<f32>(src_g[i]), bitcast<f32>(src_g[i + 1u]), bitcast<f32>(src_g[i + 2u]), bitcast<f32>(src_g[i + 3u]));
    }
    return halves4(vec2<u32>(src_g[i >> 1u], src_g[(i >> 1u) + 1u]));
}

// The weight row of accumulator c of the lane set whose first output
// column is col0: with SWIGLU the first OC are gate rows, the others the
// up rows of the same columns.
fn weight_row(col0: u32, c: u32) -> u32 {
    let row = min(col0 + c % OC, p.n - 1u);
    if SWIGLU && c >= OC {
        return row + p.n;
    }
    return row;
}

// With LORA_IN, how the projection x @ aᵀ of the chunk's M * LORA sums
// is shared: t threads a sum (the most with t sums in one round of the
// workgroup, up to 64), each taking every t-th run of 16 bytes of its row
// of `a` (4 values in f32, 8 in 16 bits) and of x.
fn low_rank_threads() -> u32 {
    return clamp(WG / (M * max(LORA, 1u)), 1u, 64u);
}

// Values in a run of 16 bytes of x and of `a`.
fn run_values() -> u32 {
    return select(8u, 4u, IN_DT == 0u);
}

// Runs of `a` a thread loads before it rounds x (the rest at the
// projection).
const LORA_EARLY: u32 = 16u;
alias LowRankRuns = array<vec4<u32>, LORA_EARLY>;

// The words of run `run` of `a`'s row `ar` (4 words).
fn a_run(ar: u32, run: u32) -> vec4<u32> {
    let e = ar * p.k + run * run_values();
    let w = select(e >> 1u, e, IN_DT == 0u);
    return vec4<u32>(src_lu[w], src_lu[w + 1u], src_lu[w + 2u], src_lu[w + 3u]);
}

// A run's words as f32, the first 4 values (or the only ones in f32) and
// the next 4.
fn run_half(words: vec4<u32>, hi: bool) -> vec4<f32> {
    if IN_DT == 0u {
        return bitcast<vec4<f32>>(words);
    }
    return halves4(select(words.xy, words.zw, hi));
}

// The dot of x's run from element e with a run of `a`'s words.
fn run_dot(e: u32, a: vec4<u32>) -> f32 {
    var s = dot(x4(e), run_half(a, false));
    if IN_DT != 0u {
        s += dot(x4(e + 4u), run_half(a, true));
    }
    return s;
}

// With LORA_IN: this thread's first runs of `a` in the projection's first
// round (see project_low_rank), loaded when the kernel starts so that
// they arrive while x is rounded, instead of after the weights.
fn fetch_low_rank(lid: u32) -> LowRankRuns {
    var runs: LowRankRuns;
    if LORA_IN {
        let t = low_rank_threads();
        let o = lid / t;
        let rank = max(LORA, 1u);
        let per_row = p.k / run_values();
        if o < M * rank && o < WG / t {
            for (var j = 0u; j < LORA_EARLY; j++) {
                let run = lid % t + j * t;
                if run < per_row {
                    runs[j] = a_run(o % rank, run);
                }
            }
        }
    }
    return runs;
}

// With LORA_IN: lora_u = x @ aᵀ for the chunk's M rows (the sums shared as
// low_rank_threads says, joined by a tree in `partial`), `early` holding
// the first round's first runs of `a` (fetch_low_rank). Called by every
// thread before the weights' products, once `partial` is free.
fn project_low_rank(lid: u32, early: LowRankRuns) {
    let outs = M * LORA;
    let t = low_rank_threads();
    let per_round = WG / t;
    let sub = lid % t;
    let per_row = p.k / run_values();
    var h0 = 1u;
    while h0 < t {
        h0 <<= 1u;
    }
    workgroupBarrier();
    // threads past the last whole group of t take no sum
    let grouped = lid < per_round * t;
    for (var o0 = 0u; o0 < outs; o0 += per_round) {
        let o = o0 + lid / t;
        var s = 0.0;
        if grouped && o < outs {
            // (LORA is 0 in the kernels that never call this)
            let rank = max(LORA, 1u);
            let xr = p.off_x + x_row(o / rank) * p.k;
            // the early runs (a constant count, so that `early` stays in
            // registers), then the rest
            for (var j = 0u; j < LORA_EARLY; j++) {
                let run = sub + j * t;
                if run < per_row {
                    var a = early[j];
                    if o0 > 0u {
                        a = a_run(o % rank, run);
                    }
                    s += run_dot(xr + run * run_values(), a);
                }
            }
            for (var run = sub + LORA_EARLY * t; run < per_row; run += t) {
                s += run_dot(xr + run * run_values(), a_run(o % rank, run));
            }
        }
        partial[lid] = s;
        workgroupBarrier();
        for (var h = h0 / 2u; h > 0u; h >>= 1u) {
            if grouped && sub < h && sub + h < t {
                partial[lid] += partial[lid + h];
            }
            workgroupBarrier();
        }
        if grouped && sub == 0u && o < outs {
            lora_u[o] = partial[lid];
        }
        workgroupBarrier();
    }
}

// Words of `b` a lane adds (add_low_rank), loaded when the kernel starts
// where they fit: B_EARLY at most.
const B_EARLY: u32 = 16u;
alias LowRankWords = array<u32, B_EARLY>;

// Ranks of `b` each lane of a set takes.
fn ranks_per_lane() -> u32 {
    return (LORA + LANES - 1u) / LANES;
}

// Whether a lane's words of `b` fit LowRankWords.
fn b_early() -> bool {
    return LORA > 0u && R * ranks_per_lane() <= B_EARLY;
}

// Element i of `b` for rank q of the accumulator's weight row `row`.
fn b_index(q: u32, row: u32) -> u32 {
    return q * select(p.n, 2u * p.n, SWIGLU) + row;
}

// The words of `b` that add_low_rank reads for the lane set whose first
// output column is col0, where b_early(): slot c * ranks_per_lane() + i
// holds rank lane + i * LANES of weight row c.
fn low_rank_words(lane: u32, col0: u32) -> LowRankWords {
    var w: LowRankWords;
    if b_early() {
        for (var c = 0u; c < R; c++) {
            let row = weight_row(col0, c);
            for (var i = 0u; i < ranks_per_lane(); i++) {
                let q = lane + i * LANES;
                if q < LORA {
                    w[c * ranks_per_lane() + i] = src_lb[word_index(b_index(q, row), IN_DT)];
                }
            }
        }
    }
    return w;
}

// Adds the low-rank update to the accumulators of the lane set whose
// first output column is col0, the ranks split across its lanes (so that
// the lane sum joins them); u from an earlier kernel is divided by the
// 1 / rms that result() applies.
fn add_low_rank(lane: u32, col0: u32, words: LowRankWords, acc: ptr<function, Accs>) {
    for (var c = 0u; c < R; c++) {
        let row = weight_row(col0, c);
        for (var r = 0u; r < M; r++) {
            var s = 0.0;
            for (var i = 0u; i < ranks_per_lane(); i++) {
                let q = lane + i * LANES;
                if q < LORA {
                    let e = b_index(q, row);
                    var w: u32;
                    if b_early() {
                        w = words[min(c * ranks_per_lane() + i, B_EARLY - 1u)];
                    } else {
                        w = src_lb[word_index(e, IN_DT)];
                    }
                    var u: f32;
                    if LORA_IN {
                        u = lora_u[r * LORA + q];
                    } else {
                        u = bitcast<f32>(src_lu[x_row(r) * LORA + q]);
                    }
                    s += u * decode(w, e, IN_DT);
                }
            }
            // u from an earlier kernel is of the normed x: result()
            // scales the whole by 1 / rms again
            if NORM && !LORA_IN {
                s /= inv_rms[r];
            }
            (*acc)[c * M + r] += s;
        }
    }
}

// The result of output column j of this lane set (slot: the lane
// set's first thread) for row r of x, before the residual.
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
        if GELU {
            // clamped: some drivers overflow inside tanh for large |x|
            let inner = 0.7978845608028654 * (v + 0.044715 * v * v * v);
            v = 0.5 * v * (1.0 + tanh(clamp(inner, -15.0, 15.0))) * u;
        } else {
            v = v / (1.0 + exp(-v)) * u;
        }
    }
    return v;
}

// The residual's words that a lane set's first lane adds to the chunk's
// row 0 (word j holds column col0 + j; OC + 1 of them, for the word a
// column may share with the next), loaded when the kernel starts, so that
// the final writes do not wait for a load of their own. Other rows load
// theirs at the end.
fn residual_words(lane: u32, col0: u32) -> array<u32, 9> {
    var w: array<u32, 9>;
    if RESIDUAL && lane == 0u {
        for (var j = 0u; j <= OC; j++) {
            w[j] = src_r[word_index(p.off_r + x_row(0u) * p.n + min(col0 + j, p.n - 1u), RES_DT)];
        }
    }
    return w;
}

// v plus the residual's element e (row e / N, the chunk's row r), where
// `early` from residual_words holds it in word j if r is 0.
fn with_residual(v: f32, e: u32, r: u32, early: array<u32, 9>, j: u32) -> f32 {
    if RESIDUAL {
        let i = p.off_r + e;
        var w = early[j];
        if r > 0u {
            w = src_r[word_index(i, RES_DT)];
        }
        return v + decode(w, i, RES_DT);
    }
    return v;
}

// Sums each accumulator over the lane set (lanes `lane` of the set whose
// first output column is col0) and writes the set's columns (`early`: see
// residual_words).
fn finish(lid: u32, lane: u32, col0: u32, acc_in: Accs, early: array<u32, 9>, lb: LowRankWords) {
    var acc = acc_in;
    if LORA > 0u {
        if NORM && !LORA_IN {
            // qgemv_i8 publishes inv_rms only at the lane sums' barrier
            workgroupBarrier();
        }
        add_low_rank(lane, col0, lb, &acc);
    }
    lane_sums(lid, lane, acc);
    if lane != 0u {
        return;
    }
    for (var j = 0u; j < OC; j++) {
        let col = col0 + j;
        if col >= p.n {
            return;
        }
        for (var r = 0u; r < M; r++) {
            if row0 + r >= p.m {
                break;
            }
            let e = (row0 + r) * p.n + col;
            let v = with_residual(result(j, r, lid), e, r, early, j);
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
                    dst[e >> 1u] = encode_pair(v, with_residual(next, e + 1u, r, early, j + 1u), OUT_DT);
                }
            } else {
                dst[e] = bitcast<u32>(v);
            }
        }
    }
}
