// store4.wgsl — the output store of the tiled matmul kernels (plain and
// quantized): needs a uniform `p` with fields m and n (dst is [m, n]),
// `dst: array<vec4<u32>>` (every pool buffer is a multiple of 16 bytes)
// and `OUT_DT`.

// Writes four consecutive outputs of row r from column c0 (even) on, as
// far as the row goes; for 16-bit outputs N is even (the launcher goes
// through f32 otherwise), so each column pair is one word that this thread
// alone writes. Four f32 outputs on a 16-byte boundary (N a multiple of 4)
// are one store, a quarter of the stores of a word at a time, which the
// end of a tile otherwise waits for (docs/tuning.md, "Matmul output
// stores").
fn store4(out0: u32, r: u32, c0: u32, v: vec4<f32>) {
    if r >= p.m {
        return;
    }
    let e0 = out0 + r * p.n + c0;
    if OUT_DT == 0u && c0 + 4u <= p.n && (e0 & 3u) == 0u {
        dst[e0 >> 2u] = bitcast<vec4<u32>>(v);
        return;
    }
    let vals = array<f32, 4>(v.x, v.y, v.z, v.w);
    for (var j = 0u; j < 4u; j += 2u) {
        let c = c0 + j;
        if c >= p.n {
            return;
        }
        let e = e0 + j;
        if OUT_DT == 1u || OUT_DT == 2u {
            let w = e >> 1u;
            dst[w >> 2u][w & 3u] = encode_pair(vals[j], vals[j + 1u], OUT_DT);
        } else {
            dst[e >> 2u][e & 3u] = bitcast<u32>(vals[j]);
            if c + 1u < p.n {
                dst[(e + 1u) >> 2u][(e + 1u) & 3u] = bitcast<u32>(vals[j + 1u]);
            }
        }
    }
}
