// matmul.wgsl — dst[z] = a[z] @ b[z] for every batch z (workgroup_id.z),
// with a [M, K] and b [K, N] any strided views (a transposed weight needs
// no copy). A 16x16 workgroup computes a 64x64 tile of dst, 4x4 per
// thread, staging 64x16 of a and 16x64 of b in workgroup memory per step.
// For 16-bit outputs N is even (the launcher goes through f32 otherwise),
// so the column pairs a thread writes share a word that no other thread
// touches.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch_rank: u32,
    off_a: u32,
    off_b: u32,
    sa_m: u32,
    sa_k: u32,
    sb_k: u32,
    sb_n: u32,
    _pad0: u32,
    _pad1: u32,
    batch_shape: array<vec4<u32>, 2>,
    batch_strides_a: array<vec4<u32>, 2>,
    batch_strides_b: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src_a: array<u32>;
@group(0) @binding(2) var<storage, read> src_b: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

override IN_DT: u32 = 0u;
override OUT_DT: u32 = 0u;

const TILE: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> tile_a: array<f32, 1024>; // [TILE][TK]
var<workgroup> tile_b: array<f32, 1024>; // [TK][TILE]

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z;
    let a0 = p.off_a + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_a);
    let b0 = p.off_b + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_b);
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    let tx = lid3.x;
    let ty = lid3.y;
    var acc: array<array<f32, 4>, 4>;
    for (var kt = 0u; kt < p.k; kt += TK) {
        for (var i = 0u; i < 4u; i++) {
            let idx = lid + i * 256u;
            let ar = row0 + idx / TK;
            let ak = kt + idx % TK;
            var va = 0.0;
            if ar < p.m && ak < p.k {
                let e = a0 + ar * p.sa_m + ak * p.sa_k;
                va = decode(src_a[word_index(e, IN_DT)], e, IN_DT);
            }
            tile_a[idx] = va;
            let bk = kt + idx / TILE;
            let bc = col0 + idx % TILE;
            var vb = 0.0;
            if bk < p.k && bc < p.n {
                let e = b0 + bk * p.sb_k + bc * p.sb_n;
                vb = decode(src_b[word_index(e, IN_DT)], e, IN_DT);
            }
            tile_b[idx] = vb;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var av: array<f32, 4>;
            var bv: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                av[i] = tile_a[(ty * 4u + i) * TK + kk];
                bv[i] = tile_b[kk * TILE + tx * 4u + i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i][j] = fma(av[i], bv[j], acc[i][j]);
                }
            }
        }
        workgroupBarrier();
    }
    let out0 = z * p.m * p.n;
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + ty * 4u + i;
        if r >= p.m {
            break;
        }
        for (var j = 0u; j < 4u; j += 2u) {
            let c = col0 + tx * 4u + j;
            if c >= p.n {
                break;
            }
            let e = out0 + r * p.n + c;
            if OUT_DT == 1u || OUT_DT == 2u {
                dst[e >> 1u] = encode_pair(acc[i][j], acc[i][j + 1u], OUT_DT);
            } else {
                dst[e] = bitcast<u32>(acc[i][j]);
                if c + 1u < p.n {
                    dst[e + 1u] = bitcast<u32>(acc[i][j + 1u]);
                }
            }
        }
    }
}
