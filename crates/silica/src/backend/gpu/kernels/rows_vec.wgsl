// rows_vec.wgsl — softmax, log-softmax, RMSNorm and LayerNorm of rows that
// can be read as whole vec4 words: one workgroup of ROW_THREADS per row,
// unit last stride, rows `row_q` words apart starting `base_q` words into
// src (0 for a broadcast), the row length a multiple of the elements per
// word (4 f32 or 8 halves), output in the input's dtype, contiguous. Each
// thread keeps its first R = 4 words of the row in registers as f32, in
// named variables and straight-line code (an array indexed in loops is
// more than twice as slow: docs/tuning.md, "Row kernels"), so a row
// of up to 4 * ROW_THREADS words is read from memory once; words past that
// are read again in each pass. The arithmetic is that of softmax.wgsl and
// norm.wgsl (the same two-pass maximum/sum and mean/variance), only the
// memory access differs. Halves are decoded with unpack2x16float; outputs
// are encoded with the exact rounding of common.wgsl. With RESIDUAL (an
// RMSNorm), `bias` holds rows to add to the output, contiguous from word
// res_q, rounded once with the sum.

struct Params {
    rows: u32,
    // words per row, first word, words between row starts
    nq: u32,
    base_q: u32,
    row_q: u32,
    eps: f32,
    res_q: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> weight: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> dst: array<vec4<u32>>;

// 0 softmax, 1 log-softmax, 2 RMSNorm, 3 LayerNorm
override OP: u32 = 0u;
override DT: u32 = 0u;
override RESIDUAL: bool = false;

const R: u32 = 4u;

// Elements per vec4 word, and f32 vectors per word.
fn per_word() -> u32 {
    return select(8u, 4u, DT == 0u);
}

fn vecs() -> u32 {
    return select(2u, 1u, DT == 0u);
}

// Four elements of a word: the first four (h = 0) or, for 16-bit dtypes,
// the last four (h = 1).
fn unpack4(q: vec4<u32>, h: u32) -> vec4<f32> {
    if DT == 0u {
        return bitcast<vec4<f32>>(q);
    }
    let a = select(q.x, q.z, h == 1u);
    let b = select(q.y, q.w, h == 1u);
    if DT == 1u {
        return vec4<f32>(unpack2x16float(a), unpack2x16float(b));
    }
    return vec4<f32>(bitcast<f32>(a << 16u), bitcast<f32>(a & 0xffff0000u), bitcast<f32>(b << 16u), bitcast<f32>(b & 0xffff0000u));
}

fn pack_half(v: vec4<f32>) -> vec2<u32> {
    return vec2<u32>(encode_pair(v.x, v.y, DT), encode_pair(v.z, v.w, DT));
}

fn sum4(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

fn max4(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}

// The output of one group of four inputs, given the row's statistics.
fn finish(x: vec4<f32>, q: u32, h: u32, a: f32, b: f32) -> vec4<f32> {
    switch OP {
        case 0u: {
            return exp(x - a) * b;
        }
        case 1u: {
            return x - a - b;
        }
        case 2u: {
            return x * b * unpack4(weight[q], h);
        }
        default: {
            return (x - a) * b * unpack4(weight[q], h) + unpack4(bias[q], h);
        }
    }
}

fn store(row: u32, q: u32, lo: vec4<f32>, hi: vec4<f32>) {
    let o = row * p.nq + q;
    if DT == 0u {
        dst[o] = bitcast<vec4<u32>>(lo);
    } else {
        dst[o] = vec4<u32>(pack_half(lo), pack_half(hi));
    }
}

// Per-thread partial of the first pass: the maximum (softmax) or the sum
// (norms) of four inputs.
fn first(x: vec4<f32>) -> f32 {
    if OP < 2u {
        return max4(x);
    }
    if OP == 2u {
        return dot(x, x);
    }
    return sum4(x);
}

// Per-thread partial of the second pass, given the first pass's result `a`.
fn second(x: vec4<f32>, a: f32) -> f32 {
    if OP < 2u {
        return sum4(exp(x - a));
    }
    let d = x - a;
    return dot(d, d);
}


struct Word {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn fetch(base: u32, q: u32) -> Word {
    let w = src[base + min(q, p.nq - 1u)];
    return Word(unpack4(w, 0u), unpack4(w, 1u));
}

fn part1(t: f32, w: Word, ok: bool) -> f32 {
    if !ok {
        return t;
    }
    if OP < 2u {
        var r = max(t, first(w.lo));
        if DT != 0u {
            r = max(r, first(w.hi));
        }
        return r;
    }
    var r = t + first(w.lo);
    if DT != 0u {
        r += first(w.hi);
    }
    return r;
}

fn part2(s: f32, w: Word, a: f32, ok: bool) -> f32 {
    if !ok {
        return s;
    }
    var r = s + second(w.lo, a);
    if DT != 0u {
        r += second(w.hi, a);
    }
    return r;
}

fn emit(row: u32, q: u32, w: Word, a: f32, b: f32) {
    if q < p.nq {
        var lo = finish(w.lo, q, 0u, a, b);
        var hi = lo;
        if DT != 0u {
            hi = finish(w.hi, q, 1u, a, b);
        }
        if RESIDUAL {
            let r = bias[p.res_q + row * p.nq + q];
            lo += unpack4(r, 0u);
            hi += unpack4(r, 1u);
        }
        store(row, q, lo, hi);
    }
}

@compute @workgroup_size(ROW_THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let base = p.base_q + row * p.row_q;
    let nf = f32(p.nq * per_word());
    // R = 4 words held: w0..w3
    let q0 = lid;
    let q1 = lid + ROW_THREADS;
    let q2 = lid + 2u * ROW_THREADS;
    let q3 = lid + 3u * ROW_THREADS;
    let w0 = fetch(base, q0);
    let w1 = fetch(base, q1);
    let w2 = fetch(base, q2);
    let w3 = fetch(base, q3);
    var t = select(0.0, bitcast<f32>(0xff800000u), OP < 2u);
    t = part1(t, w0, q0 < p.nq);
    t = part1(t, w1, q1 < p.nq);
    t = part1(t, w2, q2 < p.nq);
    t = part1(t, w3, q3 < p.nq);
    for (var q = lid + R * ROW_THREADS; q < p.nq; q += ROW_THREADS) {
        t = part1(t, fetch(base, q), true);
    }
    var a = 0.0;
    var b = 0.0;
    if OP < 2u {
        a = workgroup_max(t, lid);
    } else if OP == 3u {
        a = workgroup_sum(t, lid) / nf;
    } else {
        b = workgroup_sum(t, lid);
    }
    if OP != 2u {
        var s = 0.0;
        s = part2(s, w0, a, q0 < p.nq);
        s = part2(s, w1, a, q1 < p.nq);
        s = part2(s, w2, a, q2 < p.nq);
        s = part2(s, w3, a, q3 < p.nq);
        for (var q = lid + R * ROW_THREADS; q < p.nq; q += ROW_THREADS) {
            s = part2(s, fetch(base, q), a, true);
        }
        b = workgroup_sum(s, lid);
    }
    switch OP {
        case 0u: {
            b = 1.0 / b;
        }
        case 1u: {
            b = log(b);
        }
        default: {
            b = inverseSqrt(b / nf + p.eps);
        }
    }
    emit(row, q0, w0, a, b);
    emit(row, q1, w1, a, b);
    emit(row, q2, w2, a, b);
    emit(row, q3, w3, a, b);
    for (var q = lid + R * ROW_THREADS; q < p.nq; q += ROW_THREADS) {
        emit(row, q, fetch(base, q), a, b);
    }
}
