// matmul_common.wgsl — what the matmul and GEMV kernels share: the launch
// parameters, dst[z] = a[z] @ b[z], a [M, K] and b [K, N] strided views
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

// Writes four consecutive outputs of row r from column c0 (even) on, as
// far as the row goes; for 16-bit outputs N is even (the launcher goes
// through f32 otherwise), so each column pair is one word that this thread
// alone writes. Needs the kernel's `dst: array<u32>` and `OUT_DT`.
fn store4(out0: u32, r: u32, c0: u32, v: vec4<f32>) {
    if r >= p.m {
        return;
    }
    let vals = array<f32, 4>(v.x, v.y, v.z, v.w);
    for (var j = 0u; j < 4u; j += 2u) {
        let c = c0 + j;
        if c >= p.n {
            return;
        }
        let e = out0 + r * p.n + c;
        if OUT_DT == 1u || OUT_DT == 2u {
            dst[e >> 1u] = encode_pair(vals[j], vals[j + 1u], OUT_DT);
        } else {
            dst[e] = bitcast<u32>(vals[j]);
            if c + 1u < p.n {
                dst[e + 1u] = bitcast<u32>(vals[j + 1u]);
            }
        }
    }
}
