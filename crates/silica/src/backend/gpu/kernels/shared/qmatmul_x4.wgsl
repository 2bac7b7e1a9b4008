// qmatmul_x4.wgsl — x read four elements at a time by the quantized matmul
// kernels that bind it as vec4 words (`src_x: array<vec4<u32>>`).

// x elements e..e+3 (e a multiple of 4) as f32.
fn x4(e: u32) -> vec4<f32> {
    if IN_DT == 0u {
        return bitcast<vec4<f32>>(src_x[e >> 2u]);
    }
    let q = src_x[e >> 3u];
    var w = q.xy;
    if (e & 4u) != 0u {
        w = q.zw;
    }
    return halves4(w);
}

// Four 16-bit values of x's dtype (IN_DT f16 or bf16), two a word, as f32.
fn halves4(w: vec2<u32>) -> vec4<f32> {
    if IN_DT == 1u {
        return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
    }
    return vec4<f32>(bitcast<f32>(w.x << 16u), bitcast<f32>(w.x & 0xffff0000u), bitcast<f32>(w.y << 16u), bitcast<f32>(w.y & 0xffff0000u));
}
