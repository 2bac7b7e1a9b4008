// softmax.wgsl — one workgroup per row of the last dimension: the row's
// maximum, then the sum of exp(x - max), then the outputs (or, with LOG,
// x - max - log(sum)). Rows may be strided views like in reduce.wgsl; the
// output is contiguous. For 16-bit outputs the row length is even (the
// launcher goes through f32 otherwise), so rows start on word boundaries
// and each thread writes whole words.

struct Params {
    rows: u32,
    n: u32,
    rank: u32,
    offset: u32,
    stride: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    shape: array<vec4<u32>, 2>,
    strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

override LOG: bool = false;
override SRC_DT: u32 = 0u;
override OUT_DT: u32 = 0u;

fn load(i: u32) -> f32 {
    return decode(src[word_index(i, SRC_DT)], i, SRC_DT);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let base = p.offset + strided_offset(row, p.rank, p.shape, p.strides);
    var m = bitcast<f32>(0xff800000u);
    for (var k = lid; k < p.n; k += WG) {
        m = max(m, load(base + k * p.stride));
    }
    m = workgroup_max(m, lid);
    var s = 0.0;
    for (var k = lid; k < p.n; k += WG) {
        s += exp(load(base + k * p.stride) - m);
    }
    s = workgroup_sum(s, lid);
    let log_s = log(s);
    let inv_s = 1.0 / s;
    if OUT_DT == 1u || OUT_DT == 2u {
        for (var j = lid; j < p.n / 2u; j += WG) {
            let x0 = load(base + 2u * j * p.stride) - m;
            let x1 = load(base + (2u * j + 1u) * p.stride) - m;
            var y0 = exp(x0) * inv_s;
            var y1 = exp(x1) * inv_s;
            if LOG {
                y0 = x0 - log_s;
                y1 = x1 - log_s;
            }
            dst[row * (p.n / 2u) + j] = encode_pair(y0, y1, OUT_DT);
        }
    } else {
        for (var k = lid; k < p.n; k += WG) {
            let x = load(base + k * p.stride) - m;
            var y = exp(x) * inv_s;
            if LOG {
                y = x - log_s;
            }
            dst[row * p.n + k] = bitcast<u32>(y);
        }
    }
}
