// qmatmul.wgsl — dst = x @ wᵀ for many rows of x (prefill), w in a GGML
// block format. A 16x16 workgroup computes a 64x64 tile of dst, 4x4 per
// thread; each step of 32 along K stages 64 rows of x and 64 weight rows,
// one group of 32 each, decoded, in workgroup memory (k-major).

@group(0) @binding(0) var<uniform> p: QParams;
@group(0) @binding(1) var<storage, read> src_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> src_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<vec4<u32>>;

var<workgroup> tile_x: array<f32, 2048>; // [32][64]
var<workgroup> tile_w: array<f32, 2048>; // [32][64]

fn tx4(kk: u32, r0: u32) -> vec4<f32> {
    let i = kk * 64u + r0;
    return vec4<f32>(tile_x[i], tile_x[i + 1u], tile_x[i + 2u], tile_x[i + 3u]);
}

fn tw4(kk: u32, c0: u32) -> vec4<f32> {
    let i = kk * 64u + c0;
    return vec4<f32>(tile_w[i], tile_w[i + 1u], tile_w[i + 2u], tile_w[i + 3u]);
}

fn put_x(k0: u32, r: u32, v: vec4<f32>) {
    tile_x[k0 * 64u + r] = v.x;
    tile_x[(k0 + 1u) * 64u + r] = v.y;
    tile_x[(k0 + 2u) * 64u + r] = v.z;
    tile_x[(k0 + 3u) * 64u + r] = v.w;
}

fn put_w(k0: u32, c: u32, v: vec4<f32>) {
    tile_w[k0 * 64u + c] = v.x;
    tile_w[(k0 + 1u) * 64u + c] = v.y;
    tile_w[(k0 + 2u) * 64u + c] = v.z;
    tile_w[(k0 + 3u) * 64u + c] = v.w;
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let r0 = lid3.y * 4u;
    let c0 = lid3.x * 4u;
    // what this thread stages: row/column lid / 4, part lid % 4
    let sr = lid / 4u;
    let q = lid % 4u;
    let ko = part_k(q);
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let groups = p.k / 32u;
    for (var gi = 0u; gi < groups; gi++) {
        var xl = vec4<f32>(0.0);
        var xh = vec4<f32>(0.0);
        if row0 + sr < p.m {
            let e = p.off_x + (row0 + sr) * p.k + gi * 32u + 8u * q;
            xl = x4(e);
            xh = x4(e + 4u);
        }
        put_x(8u * q, sr, xl);
        put_x(8u * q + 4u, sr, xh);
        var wl = vec4<f32>(0.0);
        var wh = vec4<f32>(0.0);
        if col0 + sr < p.n {
            let at = group_at(col0 + sr, gi);
            let v = part_values(at.x, at.y, q, group_scale(at.x, at.y));
            wl = v[0];
            wh = v[1];
        }
        put_w(ko.x, sr, wl);
        put_w(ko.y, sr, wh);
        workgroupBarrier();
        for (var kk = 0u; kk < 32u; kk++) {
            let a = tx4(kk, r0);
            let b = tw4(kk, c0);
            acc0 = fma(vec4<f32>(a.x), b, acc0);
            acc1 = fma(vec4<f32>(a.y), b, acc1);
            acc2 = fma(vec4<f32>(a.z), b, acc2);
            acc3 = fma(vec4<f32>(a.w), b, acc3);
        }
        workgroupBarrier();
    }
    store4(0u, row0 + r0, col0 + c0, acc0);
    store4(0u, row0 + r0 + 1u, col0 + c0, acc1);
    store4(0u, row0 + r0 + 2u, col0 + c0, acc2);
    store4(0u, row0 + r0 + 3u, col0 + c0, acc3);
}
