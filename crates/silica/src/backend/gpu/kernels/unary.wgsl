// unary.wgsl — dst = f(src) elementwise; src may be any strided view.
// OP is UnaryOp's discriminant, or 100 for a dtype conversion.

struct Params {
    n: u32,
    rank: u32,
    offset: u32,
    _pad: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

override OP: u32 = 0u;
override SRC_DT: u32 = 0u;

fn erf_approx(x: f32) -> f32 {
    // Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7
    let a = abs(x);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let r = 1.0 - poly * exp(-a * a);
    return select(r, -r, x < 0.0);
}

fn apply_unary(x: f32) -> f32 {
    switch OP {
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 2u: { return exp(x); }
        case 3u: { return log(x); }
        case 4u: { return sqrt(x); }
        case 5u: { return inverseSqrt(x); }
        case 6u: { return 1.0 / x; }
        case 7u: { return x * x; }
        case 8u: { return sin(x); }
        case 9u: { return cos(x); }
        // clamped: some drivers overflow inside tanh for large |x|
        case 10u: { return tanh(clamp(x, -15.0, 15.0)); }
        case 11u: { return max(x, 0.0); }
        case 12u: { return 1.0 / (1.0 + exp(-x)); }
        case 13u: { return x / (1.0 + exp(-x)); }
        case 14u: { return 0.5 * x * (1.0 + erf_approx(x * 0.70710678118654752)); }
        case 15u: {
            let inner = 0.79788456080286536 * (x + 0.044715 * x * x * x);
            return 0.5 * x * (1.0 + tanh(clamp(inner, -15.0, 15.0)));
        }
        default: { return x; }
    }
}

fn value_at(e: u32) -> f32 {
    let i = p.offset + strided_offset(e, p.rank, p.shape, p.strides);
    return apply_unary(decode(src[word_index(i, SRC_DT)], i, SRC_DT));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    write_unit(group_index(wid, nwg) * WG + lid, p.n);
}
