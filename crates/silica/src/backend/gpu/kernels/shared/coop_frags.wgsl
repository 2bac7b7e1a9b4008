// coop_frags.wgsl — what the loops of the tiled cooperative-matrix kernels
// (coop_tiles.wgsl, coop_wide.wgsl) share: the order of the tiles, runs of
// a into its tile, and fragments out of the tiles. The loop file declares
// B_MODE, TN, PK, PN, tile_a and tile_b; stage offsets `s` count vec4<f16>
// slots.

// The first row and column of the 128 x TN tile of workgroup `wid` (of
// `nwg`): tiles are taken in bands of 8 tile rows, column by column within
// a band, so that the workgroups running together share their slices of a
// and b in the L2 cache.
fn tile_origin(wid: vec2<u32>, nwg: vec2<u32>) -> vec2<u32> {
    let id = wid.y * nwg.x + wid.x;
    let band = id / (8u * nwg.x);
    let rows = min(nwg.y - band * 8u, 8u);
    let in_band = id % (8u * nwg.x);
    return vec2<u32>((band * 8u + in_band % rows) * 128u, (in_band / rows) * TN);
}

const ZERO8 = mat2x4<f16>(vec4<f16>(0.0h), vec4<f16>(0.0h));

// Stores run g of a in stage s ([128][PK] vec4 slots, k contiguous).
fn put_a(s: u32, g: u32, v: mat2x4<f16>) {
    let t = s + (g >> 2u) * PK + (g & 3u) * 2u;
    tile_a[t] = v[0];
    tile_a[t + 1u] = v[1];
}

// The fragment of a at tile row r, k offset ks, of stage s.
fn frag_a(s: u32, r: u32, ks: u32) -> FragA {
    let at = s + r * PK + ks / 4u;
    return coopLoadT<FragA>(&tile_a[at], PK);
}

// The fragment of b at tile column c, k offset ks, of stage s.
fn frag_b(s: u32, c: u32, ks: u32) -> FragB {
    if B_MODE == 1u {
        let at = s + c * PK + ks / 4u;
        return coopLoad<FragB>(&tile_b[at], PK);
    }
    let at = s + ks * PN + c / 4u;
    return coopLoadT<FragB>(&tile_b[at], PN);
}
