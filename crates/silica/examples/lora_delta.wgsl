// y[i, j] = scale * sum_r (sum_k x[i, k] * a[k, r]) * b[r, j]; one workgroup
// per row i of x.

struct Params {
    m: u32,
    k: u32,
    r: u32,
    n: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
var<workgroup> xa: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let i = wid.x;
    // thread t forms xa[t] = (x · A)[i, t] for the ranks it owns
    if lid.x < p.r {
        var acc = 0.0;
        for (var kk = 0u; kk < p.k; kk++) {
            acc += x[i * p.k + kk] * a[kk * p.r + lid.x];
        }
        xa[lid.x] = acc;
    }
    workgroupBarrier();
    for (var j = lid.x; j < p.n; j += WG) {
        var acc = 0.0;
        for (var rr = 0u; rr < p.r; rr++) {
            acc += xa[rr] * b[rr * p.n + j];
        }
        y[i * p.n + j] = p.scale * acc;
    }
}
