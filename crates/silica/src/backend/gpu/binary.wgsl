// binary.wgsl — dst = f(a, b) elementwise over views already broadcast to
// one shape (stride 0 repeats an element), or f(a, scalar) when B_SCALAR.
// OP: BinaryOp's discriminant (0..7), or 16 + CmpOp's for comparisons,
// which write 1.0 / 0.0 (stored as u32 masks).

struct Params {
    n: u32,
    rank: u32,
    off_a: u32,
    off_b: u32,
    scalar: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    shape: array<vec4<u32>, 2>,
    strides_a: array<vec4<u32>, 2>,
    strides_b: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src_a: array<u32>;
@group(0) @binding(2) var<storage, read> src_b: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override OP: u32 = 0u;
override IN_DT: u32 = 0u;
override B_SCALAR: bool = false;

fn pow_signed(a: f32, b: f32) -> f32 {
    if b == 0.0 {
        return 1.0;
    }
    let r = pow(abs(a), b);
    if a < 0.0 {
        if b != floor(b) {
            return bitcast<f32>(0x7fc00000u); // NaN, as for real powers of negatives
        }
        return select(r, -r, fract(b * 0.5) != 0.0);
    }
    return r;
}

fn apply_binary(a: f32, b: f32) -> f32 {
    switch OP {
        case 0u: { return a + b; }
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 3u: { return a / b; }
        case 4u: { return max(a, b); }
        case 5u: { return min(a, b); }
        case 6u: { return pow_signed(a, b); }
        case 7u: { return a / (1.0 + exp(-a)) * b; }
        case 16u: { return select(0.0, 1.0, a == b); }
        case 17u: { return select(0.0, 1.0, a != b); }
        case 18u: { return select(0.0, 1.0, a < b); }
        case 19u: { return select(0.0, 1.0, a <= b); }
        case 20u: { return select(0.0, 1.0, a > b); }
        default: { return select(0.0, 1.0, a >= b); }
    }
}

fn value_at(e: u32) -> f32 {
    let ia = p.off_a + strided_offset(e, p.rank, p.shape, p.strides_a);
    let a = decode(src_a[word_index(ia, IN_DT)], ia, IN_DT);
    var b = p.scalar;
    if !B_SCALAR {
        let ib = p.off_b + strided_offset(e, p.rank, p.shape, p.strides_b);
        b = decode(src_b[word_index(ib, IN_DT)], ib, IN_DT);
    }
    return apply_binary(a, b);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    write_unit(group_index(wid, nwg) * WG + lid, p.n);
}
