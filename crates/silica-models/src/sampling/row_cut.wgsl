// row_cut.wgsl: one workgroup a row; out[row] = the threshold on
// s = l * inv_t below which the row's entries are cut (top-k by bisection
// over counts, then top-p by bisection over masses, then min-p), -inf where
// the row is not cut. The same steps as `cut_of` in sampling/device.rs;
// both bisections always run their steps so that every barrier is in
// uniform control flow, and the results are chosen at the end.

struct Params {
    rows: u32,
    vocab: u32,
    // workgroups along x: the grid may be split over x and y
    gx: u32,
    steps: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
// per row: key low, key high, counter, inv_t; top-k, top-p, min-p, 0
@group(0) @binding(2) var<storage, read> rows: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const REACH: f32 = 80.0;
const NEG_INF: u32 = 0xff800000u;

var<workgroup> red: array<f32, 256>;

// The workgroup's max (op 0) or sum (op 1) of red[], to every thread.
fn tree(lid: u32, op: u32) -> f32 {
    for (var k = 128u; k > 0u; k >>= 1u) {
        workgroupBarrier();
        if lid < k {
            let a = red[lid];
            let b = red[lid + k];
            red[lid] = select(a + b, max(a, b), op == 0u);
        }
    }
    workgroupBarrier();
    let r = red[0];
    workgroupBarrier();
    return r;
}

// This thread's count of entries with s >= t.
fn count_ge(base: u32, inv_t: f32, t: f32, lid: u32) -> f32 {
    var c = 0.0;
    for (var i = lid; i < p.vocab; i += 256u) {
        if logits[base + i] * inv_t >= t {
            c += 1.0;
        }
    }
    return c;
}

// This thread's sum of exp(s - m) over entries with s >= t.
fn mass_ge(base: u32, inv_t: f32, t: f32, m: f32, lid: u32) -> f32 {
    var c = 0.0;
    for (var i = lid; i < p.vocab; i += 256u) {
        let s = logits[base + i] * inv_t;
        if s >= t {
            c += exp(s - m);
        }
    }
    return c;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    // rows past the last (a split grid) read row 0 and write nothing
    let at = wid.y * p.gx + wid.x;
    let row = select(0u, at, at < p.rows);
    let w0 = rows[2u * row];
    let w1 = rows[2u * row + 1u];
    let inv_t = bitcast<f32>(w0.w);
    let top_k = w1.x;
    let top_p = bitcast<f32>(w1.y);
    let min_p = bitcast<f32>(w1.z);
    let base = row * p.vocab;

    var mx = bitcast<f32>(NEG_INF);
    for (var i = lid; i < p.vocab; i += 256u) {
        let s = logits[base + i] * inv_t;
        if s == s {
            mx = max(mx, s);
        }
    }
    red[lid] = mx;
    let m = tree(lid, 0u);
    let floor = m - REACH;

    red[lid] = count_ge(base, inv_t, floor, lid);
    let above = tree(lid, 1u);
    var lo = floor;
    var hi = m;
    for (var it = 0u; it < p.steps; it++) {
        let mid = lo + (hi - lo) * 0.5;
        red[lid] = count_ge(base, inv_t, mid, lid);
        let c = tree(lid, 1u);
        if c >= f32(top_k) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    var cut = select(floor, lo, top_k > 0u && above > f32(top_k));

    red[lid] = mass_ge(base, inv_t, cut, m, lid);
    let goal = top_p * tree(lid, 1u);
    lo = cut;
    hi = m;
    for (var it = 0u; it < p.steps; it++) {
        let mid = lo + (hi - lo) * 0.5;
        red[lid] = mass_ge(base, inv_t, mid, m, lid);
        let q = tree(lid, 1u);
        if q >= goal {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    cut = select(cut, lo, top_p < 1.0);
    if min_p > 0.0 {
        cut = max(cut, m + log(min_p));
    }
    let none = inv_t == 0.0 || (top_k == 0u && top_p >= 1.0 && min_p <= 0.0) || !(m > bitcast<f32>(NEG_INF));
    if lid == 0u && at < p.rows {
        out[row] = select(cut, bitcast<f32>(NEG_INF), none);
    }
}
