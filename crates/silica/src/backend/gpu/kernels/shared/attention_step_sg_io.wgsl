// attention_step_sg_io.wgsl — attention_step_sg.wgsl's bindings for one
// sequence: its keys are the cache's rows from the first (p.off_k and
// p.off_v, the window's start included) and number p.tk.

@group(0) @binding(1) var<storage, read> src_q: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;
@group(0) @binding(4) var<storage, read_write> cache: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> dst: array<vec4<u32>>;

fn seq_first(b: u32) -> u32 {
    return 0u;
}

fn seq_keys(b: u32) -> u32 {
    return p.tk;
}
