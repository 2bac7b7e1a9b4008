// row_cut.wgsl: out[row] = the threshold on s = l * inv_t below which the
// row's entries are cut (top-k over counts, then top-p over masses, then
// min-p), -inf where the row is not cut: the same searches as `cut_of` in
// sampling/device.rs, spread over the row. The op dispatches this kernel
// once a pass (2, plus 1 + passes for top-k and for top-p where a row
// asks for them), then once more to clear; dispatch `pass` has `groups`
// workgroups per row
// (x), each reading `chunk` entries, and a row per y. Each dispatch first
// derives the search's state from the state and the per-workgroup partial
// counts and masses that the one before left in `scratch`, then computes
// its own partials: the maximum (pass 0), the count (top-k) or count and
// mass (top-p) at the start of a search, or at the 7 thresholds that split
// the search's interval into eighths. A search ends once no later pass can
// change which entries it keeps (top-k: exactly k at the low end; either:
// no entry left between the ends) or after `passes` passes; the
// dispatches after the row's cut is known only write it again, and the
// last one zeroes the scratch.

struct Params {
    rows: u32,
    vocab: u32,
    // workgroups along x: one per `chunk` entries of a row
    groups: u32,
    pass_: u32,
    // passes of a search at most
    passes: u32,
    // scratch words per row: 2 states of 16, then 2 slots of partials
    stride: u32,
    // entries of a row each workgroup reads, a multiple of 256 * UNROLL
    chunk: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
// per row: key low, key high, counter, inv_t; top-k, top-p, min-p, 0
@group(0) @binding(2) var<storage, read> rows: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> scratch: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const REACH: f32 = 80.0;
const NEG_INF: u32 = 0xff800000u;
const UNROLL: u32 = 8u;

// phases: the work of a pass, and which partials a pass left
const MAXP: u32 = 0u;
const KINIT: u32 = 1u;
const KSEARCH: u32 = 2u;
const PINIT: u32 = 3u;
const PSEARCH: u32 = 4u;
const DONE: u32 = 5u;
const NOTHING: u32 = 6u;
// the pass that clears the scratch
const CLEAR: u32 = 0xffffffffu;

struct State {
    phase: u32,
    pending: u32,
    lo: f32,
    hi: f32,
    c_lo: f32,
    c_hi: f32,
    goal: f32,
    m: f32,
    cut: f32,
    it: u32,
}

var<workgroup> st: State;
// per thread: counts at thresholds 1-4 and 5-7, masses at 1-4 and 5-7
var<workgroup> red: array<array<vec4<f32>, 4>, 256>;
// the previous pass's partials, a sixteenth of the workgroups a thread
var<workgroup> part: array<f32, 256>;
var<workgroup> total: array<f32, 16>;

fn load_state(at: u32) -> State {
    return State(
        bitcast<u32>(scratch[at]), bitcast<u32>(scratch[at + 1u]),
        scratch[at + 2u], scratch[at + 3u], scratch[at + 4u], scratch[at + 5u],
        scratch[at + 6u], scratch[at + 7u], scratch[at + 8u], bitcast<u32>(scratch[at + 9u]),
    );
}

fn store_state(at: u32, s: State) {
    scratch[at] = bitcast<f32>(s.phase);
    scratch[at + 1u] = bitcast<f32>(s.pending);
    scratch[at + 2u] = s.lo;
    scratch[at + 3u] = s.hi;
    scratch[at + 4u] = s.c_lo;
    scratch[at + 5u] = s.c_hi;
    scratch[at + 6u] = s.goal;
    scratch[at + 7u] = s.m;
    scratch[at + 8u] = s.cut;
    scratch[at + 9u] = bitcast<f32>(s.it);
}

// Threshold j (0-6) of a search pass over [lo, hi].
fn threshold(lo: f32, hi: f32, j: u32) -> f32 {
    let w = (hi - lo) * 0.125;
    return lo + w * f32(j + 1u);
}

// The phase after top-k.
fn after_k(top_p: f32) -> u32 {
    return select(DONE, PINIT, top_p < 1.0);
}

// A search pass taken: the eighth of [lo, hi] whose low end is the last of
// the 7 thresholds that hold (`total[at + j]` at least `want`), with the
// counts at its ends.
fn narrow(s0: State, at: u32, want: f32) -> State {
    var s = s0;
    var n = 0u;
    for (var j = 0u; j < 7u; j++) {
        n += u32(total[at + j] >= want);
    }
    if n > 0u {
        s.lo = threshold(s0.lo, s0.hi, n - 1u);
        s.c_lo = total[n - 1u];
    }
    if n < 7u {
        s.hi = threshold(s0.lo, s0.hi, n);
        s.c_hi = total[n];
    }
    s.it += 1u;
    return s;
}

// The state for this pass from the one before and the totals `total` holds
// at 0..15 (counts at thresholds 1-7, then masses at 1-7; the maximum at 0).
fn derive(s0: State, top_k: u32, top_p: f32, none_cut: bool) -> State {
    var s = s0;
    let k = f32(top_k);
    switch s.pending {
        case MAXP: {
            s.m = total[0];
            s.cut = s.m - REACH;
            let none = none_cut || !(s.m > bitcast<f32>(NEG_INF));
            if none {
                s.phase = DONE;
                s.cut = bitcast<f32>(NEG_INF);
            } else if top_k > 0u {
                s.phase = KINIT;
            } else {
                s.phase = after_k(top_p);
            }
        }
        case KINIT: {
            if total[0] > k {
                s.lo = s.cut;
                s.hi = s.m;
                s.c_lo = total[0];
                s.it = 0u;
                s.phase = KSEARCH;
            } else {
                s.phase = after_k(top_p);
            }
        }
        case KSEARCH: {
            s = narrow(s, 0u, k);
            if s.c_lo == k || s.it >= p.passes {
                s.cut = s.lo;
                s.phase = after_k(top_p);
            }
        }
        case PINIT: {
            s.goal = top_p * total[8];
            s.lo = s.cut;
            s.hi = s.m;
            s.c_lo = total[0];
            s.c_hi = -1.0;
            s.it = 0u;
            s.phase = PSEARCH;
        }
        case PSEARCH: {
            s = narrow(s, 8u, s.goal);
            if s.c_lo == s.c_hi || s.it >= p.passes {
                s.cut = s.lo;
                s.phase = DONE;
            }
        }
        default: {}
    }
    return s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = wid.x;
    let row = wid.y;
    let sbase = row * p.stride;
    let rd = p.pass_ % 2u;
    let wr = 1u - rd;
    let slot = 32u + 16u * p.groups * rd;
    let prev = 32u + 16u * p.groups * wr;
    if p.pass_ == CLEAR {
        // the last dispatch: the scratch back to zeros
        for (var i = lid; i < 16u; i += 256u) {
            scratch[sbase + 32u + 16u * g + i] = 0.0;
            scratch[sbase + 32u + 16u * (p.groups + g) + i] = 0.0;
            if g == 0u {
                scratch[sbase + i] = 0.0;
                scratch[sbase + 16u + i] = 0.0;
            }
        }
        return;
    }
    let w0 = rows[2u * row];
    let w1 = rows[2u * row + 1u];
    let inv_t = bitcast<f32>(w0.w);
    let top_k = w1.x;
    let top_p = bitcast<f32>(w1.y);
    let min_p = bitcast<f32>(w1.z);
    let none_cut = inv_t == 0.0 || (top_k == 0u && top_p >= 1.0 && min_p <= 0.0);

    // the previous pass's partials, reduced in a fixed order (the same in
    // every workgroup, so that all derive the same state)
    var s0 = State(MAXP, NOTHING, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0u);
    if p.pass_ > 0u {
        s0 = load_state(sbase + 16u * rd);
    }
    let word = lid % 16u;
    let maxing = s0.pending == MAXP;
    var acc = select(0.0, bitcast<f32>(NEG_INF), maxing);
    if s0.pending != NOTHING {
        for (var q = lid / 16u; q < p.groups; q += 16u) {
            let v = scratch[sbase + prev + 16u * q + word];
            acc = select(acc + v, max(acc, v), maxing);
        }
    }
    part[lid] = acc;
    workgroupBarrier();
    if lid < 16u {
        var t = part[lid];
        for (var q = 1u; q < 16u; q++) {
            let v = part[lid + 16u * q];
            t = select(t + v, max(t, v), maxing);
        }
        total[lid] = t;
    }
    workgroupBarrier();
    if lid == 0u {
        if p.pass_ > 0u {
            st = derive(s0, top_k, top_p, none_cut);
        } else {
            st = s0;
        }
    }
    let s = workgroupUniformLoad(&st);

    if s.phase == DONE {
        if g == 0u && lid == 0u {
            var cut = s.cut;
            if min_p > 0.0 && cut > bitcast<f32>(NEG_INF) {
                cut = max(cut, s.m + log(min_p));
            }
            out[row] = select(cut, bitcast<f32>(NEG_INF), none_cut || !(s.m > bitcast<f32>(NEG_INF)));
            var n = s;
            n.pending = NOTHING;
            store_state(sbase + 16u * wr, n);
        }
        return;
    }

    // this pass's thresholds
    var lo = s.cut;
    var ta = vec4<f32>(s.cut);
    var tb = vec4<f32>(s.cut);
    if s.phase == KSEARCH || s.phase == PSEARCH {
        lo = s.lo;
        ta = vec4<f32>(threshold(s.lo, s.hi, 0u), threshold(s.lo, s.hi, 1u), threshold(s.lo, s.hi, 2u), threshold(s.lo, s.hi, 3u));
        tb = vec4<f32>(threshold(s.lo, s.hi, 4u), threshold(s.lo, s.hi, 5u), threshold(s.lo, s.hi, 6u), s.hi);
    }
    let mass = s.phase == PINIT || s.phase == PSEARCH;
    let base = row * p.vocab;
    let first = g * p.chunk;
    let end = min(first + p.chunk, p.vocab);
    var mx = bitcast<f32>(NEG_INF);
    var ca = vec4<f32>(0.0);
    var cb = vec4<f32>(0.0);
    var qa = vec4<f32>(0.0);
    var qb = vec4<f32>(0.0);
    for (var i0 = first + lid; i0 < end; i0 += 256u * UNROLL) {
        var v: array<f32, UNROLL>;
        for (var u = 0u; u < UNROLL; u++) {
            let i = i0 + 256u * u;
            v[u] = select(bitcast<f32>(NEG_INF), logits[base + min(i, p.vocab - 1u)], i < end);
        }
        for (var u = 0u; u < UNROLL; u++) {
            let x = v[u] * inv_t;
            if s.phase == MAXP {
                if x == x {
                    mx = max(mx, x);
                }
            } else if x >= lo {
                let e = select(0.0, exp(x - s.m), mass);
                let ga = select(vec4<f32>(0.0), vec4<f32>(1.0), vec4<f32>(x) >= ta);
                let gb = select(vec4<f32>(0.0), vec4<f32>(1.0), vec4<f32>(x) >= tb);
                ca += ga;
                cb += gb;
                qa += ga * e;
                qb += gb * e;
            }
        }
    }
    if s.phase == MAXP {
        red[lid] = array<vec4<f32>, 4>(vec4<f32>(mx), vec4<f32>(mx), vec4<f32>(mx), vec4<f32>(mx));
    } else {
        red[lid] = array<vec4<f32>, 4>(ca, cb, qa, qb);
    }
    let op_max = s.phase == MAXP;
    for (var k = 128u; k > 0u; k >>= 1u) {
        workgroupBarrier();
        if lid < k {
            for (var j = 0u; j < 4u; j++) {
                let a = red[lid][j];
                let b = red[lid + k][j];
                red[lid][j] = select(a + b, max(a, b), op_max);
            }
        }
    }
    workgroupBarrier();
    if lid < 16u {
        // counts at 1-7 in words 0-6, masses at 1-7 in words 8-14
        let r = red[0];
        var val = 0.0;
        if lid < 7u {
            val = select(r[1][lid & 3u], r[0][lid & 3u], lid < 4u);
        } else if lid >= 8u && lid < 15u {
            let j = lid - 8u;
            val = select(r[3][j & 3u], r[2][j & 3u], j < 4u);
        }
        scratch[sbase + slot + 16u * g + lid] = val;
    }
    if g == 0u && lid == 0u {
        var n = s;
        n.pending = s.phase;
        store_state(sbase + 16u * wr, n);
    }
}
