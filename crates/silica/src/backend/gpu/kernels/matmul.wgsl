// matmul.wgsl — dst[z] = a[z] @ b[z] for every batch z (workgroup_id.z),
// with a [M, K] and b [K, N] any strided views (a transposed weight needs
// no copy). A 16x16 workgroup computes a 64x64 tile of dst, 4x4 per
// thread, staging 64x16 of a and 16x64 of b in workgroup memory per step.
// For 16-bit outputs N is even (the launcher goes through f32 otherwise),
// so the column pairs a thread writes share a word that no other thread
// touches.

@group(0) @binding(1) var<storage, read> src_a: array<u32>;
@group(0) @binding(2) var<storage, read> src_b: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<u32>>;

override IN_DT: u32 = 0u;
override OUT_DT: u32 = 0u;

const TILE: u32 = 64u;
const TK: u32 = 16u;

// Both tiles are stored k-major, so a thread's 4 rows of a and 4 columns of
// b at one k are 4 consecutive words each.
var<workgroup> tile_a: array<f32, 1024>; // [TK][TILE]
var<workgroup> tile_b: array<f32, 1024>; // [TK][TILE]

fn a_vec(kk: u32, r0: u32) -> vec4<f32> {
    let i = kk * TILE + r0;
    return vec4<f32>(tile_a[i], tile_a[i + 1u], tile_a[i + 2u], tile_a[i + 3u]);
}

fn b_vec(kk: u32, c0: u32) -> vec4<f32> {
    let i = kk * TILE + c0;
    return vec4<f32>(tile_b[i], tile_b[i + 1u], tile_b[i + 2u], tile_b[i + 3u]);
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let z = wid.z;
    let a0 = p.off_a + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_a);
    let b0 = p.off_b + strided_offset(z, p.batch_rank, p.batch_shape, p.batch_strides_b);
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    let r0 = lid3.y * 4u;
    let c0 = lid3.x * 4u;
    // the 4x4 outputs of this thread, one vec4 per row: no indexed private
    // array, so they stay in registers
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var kt = 0u; kt < p.k; kt += TK) {
        for (var i = 0u; i < 4u; i++) {
            // a: 64 rows x 16 k, consecutive threads along k (contiguous for
            // row-major a); b: 16 k x 64 columns, consecutive threads along
            // the columns when b is row-major, along k when b is a
            // transposed weight
            let idx = lid + i * 256u;
            let ar = idx / TK;
            let ak = idx % TK;
            var va = 0.0;
            if row0 + ar < p.m && kt + ak < p.k {
                let e = a0 + (row0 + ar) * p.sa_m + (kt + ak) * p.sa_k;
                va = decode(src_a[word_index(e, IN_DT)], e, IN_DT);
            }
            tile_a[ak * TILE + ar] = va;
            var bk: u32;
            var bc: u32;
            if p.sb_k == 1u {
                bk = idx % TK;
                bc = idx / TK;
            } else {
                bk = idx / TILE;
                bc = idx % TILE;
            }
            var vb = 0.0;
            if kt + bk < p.k && col0 + bc < p.n {
                let e = b0 + (kt + bk) * p.sb_k + (col0 + bc) * p.sb_n;
                vb = decode(src_b[word_index(e, IN_DT)], e, IN_DT);
            }
            tile_b[bk * TILE + bc] = vb;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let av = a_vec(kk, r0);
            let bv = b_vec(kk, c0);
            acc0 = fma(vec4<f32>(av.x), bv, acc0);
            acc1 = fma(vec4<f32>(av.y), bv, acc1);
            acc2 = fma(vec4<f32>(av.z), bv, acc2);
            acc3 = fma(vec4<f32>(av.w), bv, acc3);
        }
        workgroupBarrier();
    }
    let out0 = z * p.m * p.n;
    store4(out0, row0 + r0, col0 + c0, acc0);
    store4(out0, row0 + r0 + 1u, col0 + c0, acc1);
    store4(out0, row0 + r0 + 2u, col0 + c0, acc2);
    store4(out0, row0 + r0 + 3u, col0 + c0, acc3);
}
