// matmul_coop_vec.wgsl — dst[z] = a[z] @ b[z] for f16 operands on
// cooperative matrices, through the workgroup tiles of coop_tiles.wgsl
// (128x128, double-buffered) or coop_wide.wgsl (128x256). The operands are
// read 16 bytes a load (halves8.wgsl).
//
// Layouts (the launcher checks them): a contiguous along k with every row
// start a multiple of 8 halves; b contiguous along k (B_MODE 1, a weight
// stored [N, K]) or along n (B_MODE 2, N a multiple of 8); K a multiple of
// 8 (k past K loads as zeros). Params from matmul_common.wgsl.

@group(0) @binding(1) var<storage, read> src_a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<u32>>;

override OUT_DT: u32 = 0u;

// Element offsets of a[z] and b[z].
fn origins(z: u32) -> vec2<u32> {
    let a0 = p.off_a + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_a);
    let b0 = p.off_b + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_b);
    return vec2<u32>(a0, b0);
}

// All of K for every batch entry z (coop_tiles.wgsl).
fn k_range(z: u32, nz: u32) -> vec2<u32> {
    return vec2<u32>(0u, p.k);
}

// Run g (0..511) of a[row0..+128, kt..+32]: row g / 4, halves 8 (g % 4)..+8.
fn fetch_a(a0: u32, row0: u32, kt: u32, g: u32) -> mat2x4<f16> {
    let r = min(row0 + (g >> 2u), p.m - 1u);
    let k = kt + (g & 3u) * 8u;
    if k >= p.k {
        return ZERO8;
    }
    return halves8(src_a[(a0 + r * p.sa_m + k) >> 3u]);
}

// Run g of b[kt..+32, col0..+TN] (TN from the loop file): B_MODE 1 as a
// (column g / 4), B_MODE 2 row g / (TN / 8), columns 8 (g % (TN / 8))..+8.
fn fetch_b(b0: u32, col0: u32, kt: u32, g: u32) -> mat2x4<f16> {
    if B_MODE == 1u {
        let c = min(col0 + (g >> 2u), p.n - 1u);
        let k = kt + (g & 3u) * 8u;
        if k >= p.k {
            return ZERO8;
        }
        return halves8(src_b[(b0 + c * p.sb_n + k) >> 3u]);
    }
    let k = kt + g / (TN / 8u);
    let c = min(col0 + (g % (TN / 8u)) * 8u, p.n - 8u);
    if k >= p.k {
        return ZERO8;
    }
    return halves8(src_b[(b0 + k * p.sb_k + c) >> 3u]);
}

// Stores run g of b in stage s: n-major like a (B_MODE 1) or k-major
// ([32][PN] vec4 slots, B_MODE 2).
fn put_b(s: u32, g: u32, v: mat2x4<f16>) {
    var t: u32;
    if B_MODE == 1u {
        t = s + (g >> 2u) * PK + (g & 3u) * 2u;
    } else {
        t = s + (g / (TN / 8u)) * PN + (g % (TN / 8u)) * 2u;
    }
    tile_b[t] = v[0];
    tile_b[t + 1u] = v[1];
}
