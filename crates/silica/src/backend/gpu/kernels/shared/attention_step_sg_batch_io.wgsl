// attention_step_sg_batch_io.wgsl — attention_step_sg.wgsl's bindings for
// p.batch sequences in one pooled cache: `seqs` holds, per sequence, the
// cache row of its first key (its window's start included) and its key
// count, the new position's included. Its new position is row b of src_q
// and of the angle tables.

@group(0) @binding(1) var<storage, read> src_q: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;
@group(0) @binding(4) var<storage, read> seqs: array<u32>;
@group(0) @binding(5) var<storage, read_write> cache: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> dst: array<vec4<u32>>;

fn seq_first(b: u32) -> u32 {
    return seqs[2u * b];
}

fn seq_keys(b: u32) -> u32 {
    return seqs[2u * b + 1u];
}
