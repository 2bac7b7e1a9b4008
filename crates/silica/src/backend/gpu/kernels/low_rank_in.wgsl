// u = x @ aᵀ, or rms_norm(x) @ aᵀ (no norm weight), for few rows of x:
// the first product of a low-rank update. x [M, K] and a [R, K] in the
// dtype `dt` (f32 words, or two f16 a word), u [M, R] in f32. One
// workgroup per element of u (one rank row of a against one row of x):
// r is small, and each workgroup reads its two rows once, 8 words a
// thread at a time, all loaded before any is used (the rows are cold: a
// loop of one load at a time waits for each in turn).

struct Params {
    m: u32,
    k: u32,
    r: u32,
    eps: f32,
    norm: u32,
    dt: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<u32>;
@group(0) @binding(3) var<storage, read_write> u: array<f32>;

const WG: u32 = 256u;
var<workgroup> dots: array<f32, 256>;
var<workgroup> squares: array<f32, 256>;

// the (one or two) values of word `w`, the second 0 for f32
fn values(w: u32) -> vec2<f32> {
    if p.dt == 1u {
        return unpack2x16float(w);
    }
    return vec2<f32>(bitcast<f32>(w), 0.0);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let q = wid.x;
    let row = wid.y;
    if q >= p.r || row >= p.m {
        return;
    }
    let words = select(p.k, p.k / 2u, p.dt == 1u);
    var d = 0.0;
    var s = 0.0;
    // a round: words w0..w0+3 and 4 WG further on of each thread (8 WG
    // words), those past the row left 0
    for (var w0 = lid * 4u; w0 < words; w0 += WG * 8u) {
        var xw: array<u32, 8>;
        var aw: array<u32, 8>;
        for (var i = 0u; i < 8u; i++) {
            let w = w0 + (i / 4u) * WG * 4u + i % 4u;
            if w < words {
                xw[i] = x[row * words + w];
                aw[i] = a[q * words + w];
            }
        }
        for (var i = 0u; i < 8u; i++) {
            let xv = values(xw[i]);
            d += dot(xv, values(aw[i]));
            s += dot(xv, xv);
        }
    }
    dots[lid] = d;
    squares[lid] = s;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h >>= 1u) {
        if lid < h {
            dots[lid] += dots[lid + h];
            squares[lid] += squares[lid + h];
        }
        workgroupBarrier();
    }
    if lid == 0u {
        var v = dots[0];
        if p.norm == 1u {
            v *= inverseSqrt(squares[0] / f32(p.k) + p.eps);
        }
        u[row * p.r + q] = v;
    }
}
