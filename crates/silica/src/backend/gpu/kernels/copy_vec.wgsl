// copy_vec.wgsl — a bitwise copy of `words` 32-bit words from word
// `src_word` of the source to word `dst_word` of the destination, both
// multiples of 4: thread q moves vec4 word q, and the last, partial one
// word by word.

struct Params {
    words: u32,
    src_quad: u32,
    dst_quad: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let q = group_index(wid, nwg) * WG + lid;
    let w0 = q * 4u;
    if w0 >= p.words {
        return;
    }
    let v = src[p.src_quad + q];
    if w0 + 4u <= p.words {
        dst[p.dst_quad + q] = v;
    } else {
        for (var j = 0u; w0 + j < p.words; j++) {
            dst[p.dst_quad + q][j] = v[j];
        }
    }
}
