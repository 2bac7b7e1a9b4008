// qmatmul_coop.wgsl — dst = x @ wᵀ for many rows of f16 x (prefill), w in
// a GGML block format, on cooperative matrices through coop_tiles.wgsl's
// double-buffered workgroup tiles: x is read 16 bytes a load
// (halves8.wgsl), and each weight run of 8 is decoded (quant_blocks.wgsl, in f32)
// and rounded to f16 on its way into the tile, so that a step of 32 along
// K covers one group of every weight row of the tile. Params from
// qmatmul_common.wgsl; K is a multiple of 32 and x contiguous from a
// multiple of 8 elements (the launcher checks both).
//
// With a grid of nz > 1 layers, layer z walks the z-th of nz parts of K
// (whole groups of 32) and writes its partial product, f32, at z M N of
// dst; the launcher sums the parts (split_sum.wgsl). Narrow products of
// many rows (a 1B model's 2,048-column ones at 512 rows: 64 tiles) would
// otherwise leave most of a large GPU's SMs without a workgroup.

@group(0) @binding(0) var<uniform> p: QParams;
@group(0) @binding(1) var<storage, read> src_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<u32>>;

// Element offsets of x and of the weights (one product, no batch).
fn origins(z: u32) -> vec2<u32> {
    return vec2<u32>(p.off_x, 0u);
}

// Part z of nz of K: whole steps of 32, the last part what is left.
fn k_range(z: u32, nz: u32) -> vec2<u32> {
    let part = (p.k / 32u + nz - 1u) / nz * 32u;
    return vec2<u32>(min(z * part, p.k), min((z + 1u) * part, p.k));
}

// Run g (0..511) of x[row0..+128, kt..+32]: row g / 4, halves 8 (g % 4)..+8
// (zeros at or past k_stop).
fn fetch_a(a0: u32, row0: u32, kt: u32, g: u32) -> mat2x4<f16> {
    if kt >= k_stop {
        return ZERO8;
    }
    let r = min(row0 + (g >> 2u), p.m - 1u);
    return halves8(src_x[(a0 + r * p.k + kt + (g & 3u) * 8u) >> 3u]);
}

// Part g % 4 of group kt / 32 of weight row col0 + g / 4, decoded: its two
// runs of 4 (at part_k's offsets in the group); zeros at or past k_stop.
fn fetch_b(b0: u32, col0: u32, kt: u32, g: u32) -> mat2x4<f16> {
    if kt >= k_stop {
        return ZERO8;
    }
    let at = group_at(min(col0 + (g >> 2u), p.n - 1u), kt / 32u);
    let v = part_values(at.x, at.y, g & 3u, group_scale(at.x, at.y));
    return mat2x4<f16>(vec4<f16>(v[0]), vec4<f16>(v[1]));
}

// Stores part g of the weights in stage s, n-major as x.
fn put_b(s: u32, g: u32, v: mat2x4<f16>) {
    let ko = part_k(g & 3u);
    let t = s + (g >> 2u) * PK;
    tile_b[t + ko.x / 4u] = v[0];
    tile_b[t + ko.y / 4u] = v[1];
}
