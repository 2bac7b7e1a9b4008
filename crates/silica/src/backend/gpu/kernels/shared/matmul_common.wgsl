// matmul_common.wgsl — the launch parameters of the matmul and GEMV
// kernels: dst[z] = a[z] @ b[z], a [M, K] and b [K, N] strided views
// (element offsets and strides), the batch index z decoded through the
// merged batch shape and each operand's batch strides.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch_rank: u32,
    off_a: u32,
    off_b: u32,
    sa_m: u32,
    sa_k: u32,
    sb_k: u32,
    sb_n: u32,
    _pad0: u32,
    _pad1: u32,
    batch_shape: array<vec4<u32>, 2>,
    batch_strides_a: array<vec4<u32>, 2>,
    batch_strides_b: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
