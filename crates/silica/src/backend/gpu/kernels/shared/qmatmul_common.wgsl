// qmatmul_common.wgsl — what the quantized matmul kernels share: dst [M, N]
// = x [M, K] @ wᵀ with w [N, K] in a GGML block format (quant_blocks.wgsl).
// x is contiguous from element off_x, whose rows start on whole vec4 words
// (off_x and K multiples of 8).

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
