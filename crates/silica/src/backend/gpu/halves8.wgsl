// halves8.wgsl — 8 halves from one 16-byte word of a buffer bound as
// array<vec4<u32>>, as the cooperative-matrix kernels read their f16
// operands. Bound as array<mat2x4<f16>> (or vec4<f16>), the same loads ran
// slower on an H100: 4096^3 f16 matmul took 1,029 us against 876 us, and
// attention prefill 604 against 582 us, with the conversions below. naga
// cannot bitcast u32 to a pair of halves (wgpu issue 8896), so the halves
// go through f32, exactly. On NVIDIA's driver that costs nothing
// measurable: the 4096^3 f16 matmul built from SPIR-V in which each pair's
// two conversions were rewritten into one OpBitcast took 611.8-613.1 us,
// against 610.5-613.2 with them (thirty-third session, not kept). Every
// f16-typed binding tried (16-byte structs, vec4 pairs, mat2x4, 8-byte
// pieces) was slower: 647-812 us.

fn halves8(q: vec4<u32>) -> mat2x4<f16> {
    let lo = vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y));
    let hi = vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w));
    return mat2x4<f16>(vec4<f16>(lo), vec4<f16>(hi));
}
