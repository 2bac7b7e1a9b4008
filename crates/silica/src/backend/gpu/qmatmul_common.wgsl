// qmatmul_common.wgsl — what the quantized matmul kernels share: dst [M, N]
// = x [M, K] @ wᵀ with w [N, K] in a GGML block format (quant_blocks.wgsl).
// x is contiguous from element off_x, whose rows start on whole vec4 words
// (off_x and K multiples of 8), and is bound as vec4 words.

struct QParams {
    m: u32,
    n: u32,
    k: u32,
    // bytes per weight row
    row_bytes: u32,
    off_x: u32,
    // the fusions of qgemv.wgsl: the RMSNorm's epsilon (f32 bits) and the
    // offsets of its weight (a multiple of 8) and of the residual
    eps: u32,
    off_g: u32,
    off_r: u32,
}

override IN_DT: u32 = 0u;
override OUT_DT: u32 = 0u;

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
    if IN_DT == 1u {
        return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
    }
    return vec4<f32>(bitcast<f32>(w.x << 16u), bitcast<f32>(w.x & 0xffff0000u), bitcast<f32>(w.y << 16u), bitcast<f32>(w.y & 0xffff0000u));
}
