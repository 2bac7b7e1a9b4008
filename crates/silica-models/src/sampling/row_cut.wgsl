// row_cut.wgsl: one workgroup a row; out[row] = the threshold on
// s = l * inv_t below which the row's entries are cut (top-k by bisection
// over counts, then top-p by bisection over masses, then min-p), -inf where
// the row is not cut. The same steps as `cut_of` in sampling/device.rs: a
// bisection stops once no later step can change which entries it keeps
// (top-k: exactly k at the low bound; either: no entry between the
// bounds). Every value that steers the loops comes from
// workgroupUniformLoad, so the barriers inside them stay in uniform
// control flow.

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

// (count, mass) or (max, -) of each thread, reduced in place
var<workgroup> red: array<vec2<f32>, 256>;

// The workgroup's max (op 0) or sum (op 1) of red[], to every thread.
fn tree(lid: u32, op: u32) -> vec2<f32> {
    for (var k = 128u; k > 0u; k >>= 1u) {
        workgroupBarrier();
        if lid < k {
            let a = red[lid];
            let b = red[lid + k];
            red[lid] = select(a + b, max(a, b), op == 0u);
        }
    }
    return workgroupUniformLoad(&red[0]);
}

// The row's count of entries with s >= t and, with `mass`, their sum of
// exp(s - m).
fn above(base: u32, inv_t: f32, t: f32, m: f32, mass: bool, lid: u32) -> vec2<f32> {
    var c = vec2<f32>(0.0);
    for (var i = lid; i < p.vocab; i += 256u) {
        let s = logits[base + i] * inv_t;
        if s >= t {
            c += vec2<f32>(1.0, select(0.0, exp(s - m), mass));
        }
    }
    red[lid] = c;
    return tree(lid, 1u);
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
    red[lid] = vec2<f32>(mx);
    let m = tree(lid, 0u).x;
    let none = inv_t == 0.0 || (top_k == 0u && top_p >= 1.0 && min_p <= 0.0) || !(m > bitcast<f32>(NEG_INF));
    let floor = m - REACH;
    var cut = floor;

    // top-k: the highest t with at least k entries at or above it
    if !none && top_k > 0u {
        var c_lo = above(base, inv_t, floor, m, false, lid).x;
        let k = f32(top_k);
        if c_lo > k {
            var lo = floor;
            var hi = m;
            for (var it = 0u; it < p.steps; it++) {
                if c_lo == k {
                    break;
                }
                let mid = lo + (hi - lo) * 0.5;
                let c = above(base, inv_t, mid, m, false, lid).x;
                if c >= k {
                    lo = mid;
                    c_lo = c;
                } else {
                    hi = mid;
                }
            }
            cut = lo;
        }
    }

    // top-p: the highest t whose entries hold top_p of what top-k kept
    if !none && top_p < 1.0 {
        let all = above(base, inv_t, cut, m, true, lid);
        let goal = top_p * all.y;
        var lo = cut;
        var hi = m;
        var c_lo = all.x;
        var c_hi = -1.0;
        for (var it = 0u; it < p.steps; it++) {
            if c_lo == c_hi {
                break;
            }
            let mid = lo + (hi - lo) * 0.5;
            let q = above(base, inv_t, mid, m, true, lid);
            if q.y >= goal {
                lo = mid;
                c_lo = q.x;
            } else {
                hi = mid;
                c_hi = q.x;
            }
        }
        cut = lo;
    }
    if min_p > 0.0 {
        cut = max(cut, m + log(min_p));
    }
    if lid == 0u && at < p.rows {
        out[row] = select(cut, bitcast<f32>(NEG_INF), none);
    }
}
