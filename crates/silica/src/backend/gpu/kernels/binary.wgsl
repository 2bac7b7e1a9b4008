// binary.wgsl — dst = f(a, b) elementwise over views already broadcast to
// one shape (stride 0 repeats an element), or f(a, scalar) when B_SCALAR.
// OP: BinaryOp's discriminant (0..7), or 16 + CmpOp's for comparisons,
// which write 1.0 / 0.0 (stored as u32 masks).

struct Params {
    n: u32,
    rank: u32,
    off_a: u32,
    off_b: u32,
    scalar: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    shape: array<vec4<u32>, 2>,
    strides_a: array<vec4<u32>, 2>,
    strides_b: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src_a: array<u32>;
@group(0) @binding(2) var<storage, read> src_b: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override IN_DT: u32 = 0u;
override B_SCALAR: bool = false;

fn value_at(e: u32) -> f32 {
    let ia = p.off_a + strided_offset(e, p.rank, p.shape, p.strides_a);
    let a = decode(src_a[word_index(ia, IN_DT)], ia, IN_DT);
    var b = p.scalar;
    if !B_SCALAR {
        let ib = p.off_b + strided_offset(e, p.rank, p.shape, p.strides_b);
        b = decode(src_b[word_index(ib, IN_DT)], ib, IN_DT);
    }
    return apply_binary(a, b);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    write_unit(group_index(wid, nwg) * WG + lid, p.n);
}
