// quant_blocks.wgsl — decoding GGML blocks as they lie in the file, for
// the quantized matmul kernels. The blocks are bound as `src_w:
// array<u32>` (the kernel declares it; the byte length is padded to whole
// words). Block sizes of Q8_0, Q4_0, Q5_0 and Q6_K are 2 mod 4 bytes, so
// every read goes through `wrd`, which reads the word at any even byte.
//
// A row is cut into groups of 32 values (a block of the simple formats, a
// sub-block of the K-quants), and a group into 4 parts of 8 values that one
// thread decodes at once: `part_k` says where the part's two runs of 4 sit
// in the group, `group_scale` gives the affine map of the group's quants
// (value = d * q + m; one (d, m) for parts 0-1 and one for parts 2-3, which
// differ only for Q6_K's scale per 16 values), `part_quants` the quants.

// QuantFormat::gpu_code: 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 Q5_1, 5 Q4_K,
// 6 Q5_K, 7 Q6_K.
override FMT: u32 = 0u;

fn block_bytes() -> u32 {
    switch FMT {
        case 0u: {
            return 34u;
        }
        case 1u: {
            return 18u;
        }
        case 2u: {
            return 20u;
        }
        case 3u: {
            return 22u;
        }
        case 4u: {
            return 24u;
        }
        case 5u: {
            return 144u;
        }
        case 6u: {
            return 176u;
        }
        default: {
            return 210u;
        }
    }
}

// Groups of 32 per block.
fn block_groups() -> u32 {
    if FMT >= 5u {
        return 8u;
    }
    return 1u;
}

// The little-endian word that starts at byte `b` (even).
fn wrd(b: u32) -> u32 {
    let i = b >> 2u;
    if (b & 2u) == 0u {
        return src_w[i];
    }
    return (src_w[i] >> 16u) | (src_w[i + 1u] << 16u);
}

// The 16 bits at byte `b` (even).
fn half_bits(b: u32) -> u32 {
    return (src_w[b >> 2u] >> ((b & 2u) * 8u)) & 0xffffu;
}

fn f16_at(b: u32) -> f32 {
    let h = half_bits(b);
    // the hardware conversion for normal values (much cheaper than the
    // integer routine); zero and subnormals, which some GPUs flush, exactly
    if (h & 0x7c00u) == 0u {
        return f16_to_f32(h);
    }
    return unpack2x16float(h).x;
}

fn byte_at(b: u32) -> u32 {
    return (src_w[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// The four bytes of `w` as unsigned values; as signed; the low nibbles.
fn u8x4(w: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu));
}

fn i8x4(w: u32) -> vec4<f32> {
    let i = bitcast<i32>(w);
    return vec4<f32>(f32(extractBits(i, 0u, 8u)), f32(extractBits(i, 8u, 8u)), f32(extractBits(i, 16u, 8u)), f32(extractBits(i, 24u, 8u)));
}

fn nib4(w: u32) -> vec4<f32> {
    return u8x4(w & 0x0f0f0f0fu);
}

// Bits s..s+3 of `h`, each as 16 or 0 (the fifth bit of Q5_0/Q5_1).
fn bits16(h: u32, s: u32) -> vec4<f32> {
    let b = (vec4<u32>(h) >> (vec4<u32>(s) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u);
    return vec4<f32>(b * 16u);
}

// Offsets in its group of the two runs of 4 values of part `q`.
fn part_k(q: u32) -> vec2<u32> {
    if FMT >= 1u && FMT <= 4u {
        // element j in the low nibble of byte j, j + 16 in its high nibble
        return vec2<u32>(4u * q, 16u + 4u * q);
    }
    return vec2<u32>(8u * q, 8u * q + 4u);
}

// 6-bit scale and minimum of sub-block j of a Q4_K/Q5_K block whose 12
// scale bytes start at byte s.
fn scale_min_k4(s: u32, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(byte_at(s + j) & 63u), f32(byte_at(s + j + 4u) & 63u));
    }
    let hi = byte_at(s + j + 4u);
    let sc = (hi & 0xfu) | ((byte_at(s + j - 4u) >> 6u) << 4u);
    let mn = (hi >> 4u) | ((byte_at(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(mn));
}

// (d, m) of parts 0-1 and of parts 2-3 of group g of the block at byte `base`.
fn group_scale(base: u32, g: u32) -> vec4<f32> {
    switch FMT {
        case 0u: {
            let d = f16_at(base);
            return vec4<f32>(d, 0.0, d, 0.0);
        }
        case 1u: {
            let d = f16_at(base);
            return vec4<f32>(d, -8.0 * d, d, -8.0 * d);
        }
        case 2u, 4u: {
            let d = f16_at(base);
            let m = f16_at(base + 2u);
            return vec4<f32>(d, m, d, m);
        }
        case 3u: {
            let d = f16_at(base);
            return vec4<f32>(d, -16.0 * d, d, -16.0 * d);
        }
        case 5u, 6u: {
            let sm = scale_min_k4(base + 4u, g);
            let d = f16_at(base) * sm.x;
            let m = -f16_at(base + 2u) * sm.y;
            return vec4<f32>(d, m, d, m);
        }
        default: {
            // Q6_K: the group's two 8-bit scales sit side by side
            let d = f16_at(base + 208u);
            let sc = bitcast<i32>(half_bits(base + 192u + 8u * (g / 4u) + 2u * (g % 4u)));
            let d0 = d * f32(extractBits(sc, 0u, 8u));
            let d1 = d * f32(extractBits(sc, 8u, 8u));
            return vec4<f32>(d0, -32.0 * d0, d1, -32.0 * d1);
        }
    }
}

// The quants of part q of group g of the block at byte `base`: the runs at
// part_k(q).x and part_k(q).y.
fn part_quants(base: u32, g: u32, q: u32) -> array<vec4<f32>, 2> {
    switch FMT {
        case 0u: {
            return array<vec4<f32>, 2>(i8x4(wrd(base + 2u + 8u * q)), i8x4(wrd(base + 6u + 8u * q)));
        }
        case 1u: {
            let w = wrd(base + 2u + 4u * q);
            return array<vec4<f32>, 2>(nib4(w), nib4(w >> 4u));
        }
        case 2u: {
            let w = wrd(base + 4u + 4u * q);
            return array<vec4<f32>, 2>(nib4(w), nib4(w >> 4u));
        }
        case 3u: {
            let w = wrd(base + 6u + 4u * q);
            let h = wrd(base + 2u);
            return array<vec4<f32>, 2>(nib4(w) + bits16(h, 4u * q), nib4(w >> 4u) + bits16(h, 16u + 4u * q));
        }
        case 4u: {
            let w = wrd(base + 8u + 4u * q);
            let h = wrd(base + 4u);
            return array<vec4<f32>, 2>(nib4(w) + bits16(h, 4u * q), nib4(w >> 4u) + bits16(h, 16u + 4u * q));
        }
        case 5u: {
            // 64 values per 32 bytes: low nibbles for even groups, high for odd
            let s = 4u * (g & 1u);
            let b = base + 16u + 32u * (g / 2u) + 8u * q;
            return array<vec4<f32>, 2>(nib4(wrd(b) >> s), nib4(wrd(b + 4u) >> s));
        }
        case 6u: {
            let s = 4u * (g & 1u);
            let b = base + 48u + 32u * (g / 2u) + 8u * q;
            // the fifth bit: bit g of qh[l]
            let h0 = ((wrd(base + 16u + 8u * q) >> g) & 0x01010101u) << 4u;
            let h1 = ((wrd(base + 20u + 8u * q) >> g) & 0x01010101u) << 4u;
            return array<vec4<f32>, 2>(u8x4(((wrd(b) >> s) & 0x0f0f0f0fu) | h0), u8x4(((wrd(b + 4u) >> s) & 0x0f0f0f0fu) | h1));
        }
        default: {
            // Q6_K: group g = 4n + t; value l takes the nibble 4 * (t >> 1) of
            // ql[64n + 32 (t & 1) + l] and bits 2t, 2t + 1 of qh[32n + l]
            let n = g / 4u;
            let t = g % 4u;
            let bl = base + 64u * n + 32u * (t & 1u) + 8u * q;
            let bh = base + 128u + 32u * n + 8u * q;
            let sl = 4u * (t >> 1u);
            let sh = 2u * t;
            let q0 = ((wrd(bl) >> sl) & 0x0f0f0f0fu) | (((wrd(bh) >> sh) & 0x03030303u) << 4u);
            let q1 = ((wrd(bl + 4u) >> sl) & 0x0f0f0f0fu) | (((wrd(bh + 4u) >> sh) & 0x03030303u) << 4u);
            return array<vec4<f32>, 2>(u8x4(q0), u8x4(q1));
        }
    }
}

// The 8 values of part q of group g, decoded with the group's scales s.
fn part_values(base: u32, g: u32, q: u32, s: vec4<f32>) -> array<vec4<f32>, 2> {
    let qs = part_quants(base, g, q);
    var dm = s.xy;
    if q >= 2u {
        dm = s.zw;
    }
    return array<vec4<f32>, 2>(fma(qs[0], vec4<f32>(dm.x), vec4<f32>(dm.y)), fma(qs[1], vec4<f32>(dm.x), vec4<f32>(dm.y)));
}

// Byte offset of the block that holds group `gi` of weight row `row`, and
// the group's index in that block.
fn group_at(row: u32, gi: u32) -> vec2<u32> {
    let per = block_groups();
    return vec2<u32>(row * p.row_bytes + (gi / per) * block_bytes(), gi % per);
}

// Formats whose parts `part_biased` decodes (Q8_0, Q4_0, Q4_1).
fn has_biased() -> bool {
    return FMT <= 2u;
}

// Bits per quant in `part_biased`'s form.
fn biased_bits() -> u32 {
    if FMT == 0u {
        return 8u;
    }
    return 4u;
}

// The quants of part q of the block at byte `base` as 1 + u / 2^B, with u
// the unsigned quant (Q8_0's q + 128) and B = biased_bits(): the quant is
// placed in the top mantissa bits of 1.0, a shift and a mask per value
// instead of an integer-to-float conversion, which GPUs issue at a fraction
// of the rate of arithmetic. The dot of u with x is then 2^B (S - X) for
// S the dot of these values with x and X the sum of x (see qgemv.wgsl).
fn part_biased(base: u32, q: u32) -> array<vec4<f32>, 2> {
    let one = vec4<u32>(0x3f800000u);
    if FMT == 0u {
        // bytes 8q..8q+7, signed; u = q + 128 is the byte with its top bit flipped
        let a = wrd(base + 2u + 8u * q) ^ 0x80808080u;
        let b = wrd(base + 6u + 8u * q) ^ 0x80808080u;
        let m = vec4<u32>(0x007f8000u);
        return array<vec4<f32>, 2>(
            bitcast<vec4<f32>>((vec4<u32>(a << 15u, a << 7u, a >> 1u, a >> 9u) & m) | one),
            bitcast<vec4<f32>>((vec4<u32>(b << 15u, b << 7u, b >> 1u, b >> 9u) & m) | one),
        );
    }
    // Q4_0 / Q4_1: value 4q + i in the low nibble of byte i, 16 + 4q + i in its high nibble
    var w: u32;
    if FMT == 1u {
        w = wrd(base + 2u + 4u * q);
    } else {
        w = wrd(base + 4u + 4u * q);
    }
    let m = vec4<u32>(0x00780000u);
    return array<vec4<f32>, 2>(
        bitcast<vec4<f32>>((vec4<u32>(w << 19u, w << 11u, w << 3u, w >> 5u) & m) | one),
        bitcast<vec4<f32>>((vec4<u32>(w << 15u, w << 7u, w >> 1u, w >> 9u) & m) | one),
    );
}
