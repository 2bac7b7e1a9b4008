// penalty_count.wgsl: counts[row * vocab + id] += 1 for each (id, row)
// pair of `pairs` (the tokens the host knows each row has seen) and for
// each (pick, row) pair of `flight` (row's token picks[pick], picked on the
// device and not read back yet); ids at or past the vocabulary and rows
// past the last count nowhere.

struct Params {
    n: u32,
    flights: u32,
    vocab: u32,
    // workgroups along x: the grid may be split over x and y
    gx: u32,
    rows: u32,
    picks: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> pairs: array<u32>;
@group(0) @binding(3) var<storage, read> picks: array<u32>;
@group(0) @binding(4) var<storage, read> flight: array<u32>;
@group(0) @binding(5) var<storage, read> pens: array<f32>;
@group(0) @binding(6) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * p.gx + wid.x) * 256u + lid;
    var id = 0xffffffffu;
    var row = 0u;
    if i < p.n {
        id = pairs[2u * i];
        row = pairs[2u * i + 1u];
    } else if i < p.n + p.flights {
        let j = i - p.n;
        let pick = flight[2u * j];
        if pick < p.picks {
            id = picks[pick];
        }
        row = flight[2u * j + 1u];
    }
    if id < p.vocab && row < p.rows {
        atomicAdd(&counts[row * p.vocab + id], 1u);
    }
}
