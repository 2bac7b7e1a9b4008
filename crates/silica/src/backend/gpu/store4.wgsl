// store4.wgsl — the output store of the tiled matmul kernels (plain and
// quantized): needs a uniform `p` with fields m and n (dst is [m, n]),
// `dst: array<u32>` and `OUT_DT`.

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
