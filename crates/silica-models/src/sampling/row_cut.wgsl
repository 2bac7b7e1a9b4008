// row_cut.wgsl: one workgroup a row; out[row] = the threshold on
// s = l * inv_t below which the row's entries are cut (top-k over counts,
// then top-p over masses, then min-p), -inf where the row is not cut. The
// same steps as `cut_of` in sampling/device.rs. Each pass over the row
// counts the entries (and sums their masses) at 7 thresholds that split
// [lo, hi] into 8, and keeps the part where the cut lies; a search stops
// once no later pass can change which entries it keeps (top-k: exactly k
// at lo; either: no entry between lo and hi). Every value that steers the
// loops comes from workgroupUniformLoad, so the barriers inside them stay
// in uniform control flow. Each thread has 8 loads in flight.

struct Params {
    rows: u32,
    vocab: u32,
    // workgroups along x: the grid may be split over x and y
    gx: u32,
    // passes of a search at most
    passes: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
// per row: key low, key high, counter, inv_t; top-k, top-p, min-p, 0
@group(0) @binding(2) var<storage, read> rows: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const REACH: f32 = 80.0;
const NEG_INF: u32 = 0xff800000u;
const UNROLL: u32 = 8u;

// per thread: counts at thresholds 1-4 and 5-7, masses at 1-4 and 5-7
var<workgroup> red: array<array<vec4<f32>, 4>, 256>;

struct Pass {
    ca: vec4<f32>,
    cb: vec4<f32>,
    qa: vec4<f32>,
    qb: vec4<f32>,
}

// The workgroup's sums of red[] (or maxima, op 0), to every thread.
fn tree(lid: u32, op: u32) -> Pass {
    for (var k = 128u; k > 0u; k >>= 1u) {
        workgroupBarrier();
        if lid < k {
            for (var j = 0u; j < 4u; j++) {
                let a = red[lid][j];
                let b = red[lid + k][j];
                red[lid][j] = select(a + b, max(a, b), op == 0u);
            }
        }
    }
    return Pass(
        workgroupUniformLoad(&red[0][0]),
        workgroupUniformLoad(&red[0][1]),
        workgroupUniformLoad(&red[0][2]),
        workgroupUniformLoad(&red[0][3]),
    );
}

// The row's counts of entries at or above ta / tb (and with `mass` their
// sums of exp(s - m)); entries below lo count nowhere.
fn above(base: u32, inv_t: f32, lo: f32, ta: vec4<f32>, tb: vec4<f32>, m: f32, mass: bool, lid: u32) -> Pass {
    var r = Pass(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    for (var i0 = lid; i0 < p.vocab; i0 += 256u * UNROLL) {
        var v: array<f32, UNROLL>;
        for (var u = 0u; u < UNROLL; u++) {
            let i = i0 + 256u * u;
            v[u] = select(bitcast<f32>(NEG_INF), logits[base + min(i, p.vocab - 1u)], i < p.vocab);
        }
        for (var u = 0u; u < UNROLL; u++) {
            let s = v[u] * inv_t;
            if s >= lo {
                let e = select(0.0, exp(s - m), mass);
                let ga = select(vec4<f32>(0.0), vec4<f32>(1.0), vec4<f32>(s) >= ta);
                let gb = select(vec4<f32>(0.0), vec4<f32>(1.0), vec4<f32>(s) >= tb);
                r.ca += ga;
                r.cb += gb;
                r.qa += ga * e;
                r.qb += gb * e;
            }
        }
    }
    red[lid] = array<vec4<f32>, 4>(r.ca, r.cb, r.qa, r.qb);
    return tree(lid, 1u);
}

// Thresholds 1-7 of [lo, hi] in eighths (the eighth is unused).
fn cuts_a(lo: f32, w: f32) -> vec4<f32> {
    return vec4<f32>(lo + w, lo + w * 2.0, lo + w * 3.0, lo + w * 4.0);
}
fn cuts_b(lo: f32, w: f32, hi: f32) -> vec4<f32> {
    return vec4<f32>(lo + w * 5.0, lo + w * 6.0, lo + w * 7.0, hi);
}

// Component j of a, then b.
fn at(a: vec4<f32>, b: vec4<f32>, j: u32) -> f32 {
    return select(b[j & 3u], a[j & 3u], j < 4u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    // rows past the last (a split grid) read row 0 and write nothing
    let g = wid.y * p.gx + wid.x;
    let row = select(0u, g, g < p.rows);
    let w0 = rows[2u * row];
    let w1 = rows[2u * row + 1u];
    let inv_t = bitcast<f32>(w0.w);
    let top_k = w1.x;
    let top_p = bitcast<f32>(w1.y);
    let min_p = bitcast<f32>(w1.z);
    let base = row * p.vocab;

    var mx = bitcast<f32>(NEG_INF);
    for (var i0 = lid; i0 < p.vocab; i0 += 256u * UNROLL) {
        var v: array<f32, UNROLL>;
        for (var u = 0u; u < UNROLL; u++) {
            let i = i0 + 256u * u;
            v[u] = select(bitcast<f32>(NEG_INF), logits[base + min(i, p.vocab - 1u)], i < p.vocab);
        }
        for (var u = 0u; u < UNROLL; u++) {
            let s = v[u] * inv_t;
            if s == s {
                mx = max(mx, s);
            }
        }
    }
    red[lid] = array<vec4<f32>, 4>(vec4<f32>(mx), vec4<f32>(mx), vec4<f32>(mx), vec4<f32>(mx));
    let m = tree(lid, 0u).ca.x;
    let none = inv_t == 0.0 || (top_k == 0u && top_p >= 1.0 && min_p <= 0.0) || !(m > bitcast<f32>(NEG_INF));
    let floor = m - REACH;
    let all = vec4<f32>(floor);
    var cut = floor;

    // top-k: the highest t with at least k entries at or above it
    if !none && top_k > 0u {
        let k = f32(top_k);
        var c_lo = above(base, inv_t, floor, all, all, m, false, lid).ca.x;
        if c_lo > k {
            var lo = floor;
            var hi = m;
            for (var it = 0u; it < p.passes; it++) {
                if c_lo == k {
                    break;
                }
                let w = (hi - lo) * 0.125;
                let ta = cuts_a(lo, w);
                let tb = cuts_b(lo, w, hi);
                let r = above(base, inv_t, lo, ta, tb, m, false, lid);
                // how many of the 7 thresholds keep at least k
                let n = dot(select(vec4<f32>(0.0), vec4<f32>(1.0), r.ca >= vec4<f32>(k)), vec4<f32>(1.0))
                    + dot(select(vec4<f32>(0.0), vec4<f32>(1.0, 1.0, 1.0, 0.0), r.cb >= vec4<f32>(k)), vec4<f32>(1.0));
                let j = u32(n);
                if j > 0u {
                    lo = at(ta, tb, j - 1u);
                    c_lo = at(r.ca, r.cb, j - 1u);
                }
                if j < 7u {
                    hi = at(ta, tb, j);
                }
            }
            cut = lo;
        }
    }

    // top-p: the highest t whose entries hold top_p of what top-k kept
    if !none && top_p < 1.0 {
        let c0 = vec4<f32>(cut);
        let r0 = above(base, inv_t, cut, c0, c0, m, true, lid);
        let goal = top_p * r0.qa.x;
        var lo = cut;
        var hi = m;
        var c_lo = r0.ca.x;
        var c_hi = -1.0;
        for (var it = 0u; it < p.passes; it++) {
            if c_lo == c_hi {
                break;
            }
            let w = (hi - lo) * 0.125;
            let ta = cuts_a(lo, w);
            let tb = cuts_b(lo, w, hi);
            let r = above(base, inv_t, lo, ta, tb, m, true, lid);
            let n = dot(select(vec4<f32>(0.0), vec4<f32>(1.0), r.qa >= vec4<f32>(goal)), vec4<f32>(1.0))
                + dot(select(vec4<f32>(0.0), vec4<f32>(1.0, 1.0, 1.0, 0.0), r.qb >= vec4<f32>(goal)), vec4<f32>(1.0));
            let j = u32(n);
            if j > 0u {
                lo = at(ta, tb, j - 1u);
                c_lo = at(r.ca, r.cb, j - 1u);
            }
            if j < 7u {
                hi = at(ta, tb, j);
                c_hi = at(r.ca, r.cb, j);
            }
        }
        cut = lo;
    }
    if min_p > 0.0 {
        cut = max(cut, m + log(min_p));
    }
    if lid == 0u && g < p.rows {
        out[row] = select(cut, bitcast<f32>(NEG_INF), none);
    }
}
