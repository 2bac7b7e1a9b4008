// gemv.wgsl — matmul for few rows of a (M <= 8: decode steps). A group of
// LANES threads computes one column of dst for all rows, striding along K, so
// that a weight stored row-major as [N, K] and used transposed (b = w.t(),
// the usual x @ wᵀ) is read contiguously; 256 / LANES columns per workgroup. The
// Params from matmul_common.wgsl; a and b are bound as arrays of vec4 words.
// VEC (both operands contiguous along k, every row start a multiple of
// CH elements): each lane reads whole vec4 words, CH = 4 f32 or 8 halves,
// and the tail of k that does not fill a word is read element-wise.

@group(0) @binding(1) var<storage, read> src_a: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override IN_DT: u32 = 0u;
override OUT_DT: u32 = 0u;
// Rows of a (p.m), as a constant so that the loops over rows unroll and the
// accumulators stay in registers.
override M: u32 = 1u;
override VEC: bool = false;

// Threads per column: more for long rows of few columns, so that enough
// loads are in flight (32, 64 or 128: a workgroup holds an even number of
// columns, which 16-bit outputs need).
override LANES: u32 = 32u;

fn elem_a(e: u32) -> f32 {
    let w = word_index(e, IN_DT);
    return decode(src_a[w >> 2u][w & 3u], e, IN_DT);
}

fn elem_b(e: u32) -> f32 {
    let w = word_index(e, IN_DT);
    return decode(src_b[w >> 2u][w & 3u], e, IN_DT);
}

// Elements per vec4 word.
fn chunk() -> u32 {
    if IN_DT == 0u {
        return 4u;
    }
    return 8u;
}

// The first four elements of a vec4 word (all of it for f32)...
fn lo4(q: vec4<u32>) -> vec4<f32> {
    if IN_DT == 0u {
        return bitcast<vec4<f32>>(q);
    }
    if IN_DT == 1u {
        return vec4<f32>(unpack2x16float(q.x), unpack2x16float(q.y));
    }
    return vec4<f32>(bitcast<f32>(q.x << 16u), bitcast<f32>(q.x & 0xffff0000u), bitcast<f32>(q.y << 16u), bitcast<f32>(q.y & 0xffff0000u));
}

// ... and for 16-bit types the last four.
fn hi4(q: vec4<u32>) -> vec4<f32> {
    if IN_DT == 1u {
        return vec4<f32>(unpack2x16float(q.z), unpack2x16float(q.w));
    }
    return vec4<f32>(bitcast<f32>(q.z << 16u), bitcast<f32>(q.z & 0xffff0000u), bitcast<f32>(q.w << 16u), bitcast<f32>(q.w & 0xffff0000u));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z;
    let a0 = p.off_a + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_a);
    let b0 = p.off_b + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_b);
    let lane = lid % LANES;
    let col = wid.x * (WG / LANES) + lid / LANES;
    var acc: array<f32, 8>;
    if col < p.n {
        var tail = 0u;
        if VEC {
            let ch = chunk();
            let words = p.k / ch;
            tail = words * ch;
            // two words per step, so that each thread has two loads of b
            // in flight
            var w = lane;
            for (; w + LANES < words; w += 2u * LANES) {
                let k0 = w * ch;
                let k1 = k0 + LANES * ch;
                let qb0 = src_b[(b0 + col * p.sb_n + k0) / ch];
                let qb1 = src_b[(b0 + col * p.sb_n + k1) / ch];
                for (var r = 0u; r < M; r++) {
                    let qa0 = src_a[(a0 + r * p.sa_m + k0) / ch];
                    let qa1 = src_a[(a0 + r * p.sa_m + k1) / ch];
                    var s = dot(lo4(qa0), lo4(qb0)) + dot(lo4(qa1), lo4(qb1));
                    if IN_DT != 0u {
                        s += dot(hi4(qa0), hi4(qb0)) + dot(hi4(qa1), hi4(qb1));
                    }
                    acc[r] += s;
                }
            }
            if w < words {
                let k = w * ch;
                let qb = src_b[(b0 + col * p.sb_n + k) / ch];
                for (var r = 0u; r < M; r++) {
                    let qa = src_a[(a0 + r * p.sa_m + k) / ch];
                    var s = dot(lo4(qa), lo4(qb));
                    if IN_DT != 0u {
                        s += dot(hi4(qa), hi4(qb));
                    }
                    acc[r] += s;
                }
            }
        }
        for (var k = tail + lane; k < p.k; k += LANES) {
            let bv = elem_b(b0 + k * p.sb_k + col * p.sb_n);
            for (var r = 0u; r < M; r++) {
                acc[r] = fma(elem_a(a0 + r * p.sa_m + k * p.sa_k), bv, acc[r]);
            }
        }
    }
    gemv_finish(acc, lid, col, z * p.m * p.n);
}
