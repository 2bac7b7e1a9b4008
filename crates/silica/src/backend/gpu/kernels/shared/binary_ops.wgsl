// binary_ops.wgsl — the functions of the binary kernels. OP: BinaryOp's
// discriminant (0..7), or 16 + CmpOp's for comparisons, which give 1.0 / 0.0.

override OP: u32 = 0u;

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

