// halves8.wgsl — 8 halves from one 16-byte word of a buffer bound as
// array<vec4<u32>>, as the cooperative-matrix kernels read their f16
// operands: the same loads through any f16-typed binding (mat2x4, vec4
// pairs, 16-byte structs, 8-byte pieces) are slower. naga cannot bitcast
// u32 to a pair of halves (wgpu issue 8896), so the halves go through
// f32, exactly; on NVIDIA's driver that costs nothing measurable against
// a bitcast (docs/tuning.md, "f16 operands as 16-byte words").

fn halves8(q: vec4<u32>) -> mat2x4<f16> {
    let lo = vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y));
    let hi = vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w));
    return mat2x4<f16>(vec4<f16>(lo), vec4<f16>(hi));
}
