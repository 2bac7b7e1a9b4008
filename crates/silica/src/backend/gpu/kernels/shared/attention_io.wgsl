// attention_io.wgsl — the bindings of the scalar attention kernels (q, k,
// v and mask as words, the output after them) and the word loads that
// attention_loads.wgsl builds on. attention_step_io.wgsl binds the same
// kernels for a decode step over a KV cache instead.

@group(0) @binding(1) var<storage, read> src_q: array<u32>;
@group(0) @binding(2) var<storage, read> src_k: array<u32>;
@group(0) @binding(3) var<storage, read> src_v: array<u32>;
@group(0) @binding(4) var<storage, read> src_m: array<u32>;
@group(0) @binding(5) var<storage, read_write> dst: array<u32>;

// Word `i` of input `which` (a constant at every call site).
fn word(which: u32, i: u32) -> u32 {
    switch which {
        case 0u: {
            return src_q[i];
        }
        case 1u: {
            return src_k[i];
        }
        case 2u: {
            return src_v[i];
        }
        default: {
            return src_m[i];
        }
    }
}

// decode_attention.wgsl's hooks for a decode step (STEP): these kernels
// read a KV cache that holds every key already, so they never call them.
const STEP: bool = false;

fn step_q4(head: u32, c: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

fn step_k4(kvh: u32, c: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

fn step_v4(kvh: u32, c: u32) -> vec4<f32> {
    return vec4<f32>(0.0);
}

fn step_store(e: u32, v: vec4<f32>) {}
