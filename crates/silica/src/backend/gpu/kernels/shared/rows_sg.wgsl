// rows_sg.wgsl — rows.wgsl's workgroup-wide max and sum through subgroup
// operations, for adapters whose subgroups all have one width (32 on
// NVIDIA and Apple GPUs, 8 on lavapipe): each subgroup reduces its values,
// its first thread writes the result to the subgroup's slot, and after one
// barrier every thread combines the slots in the same order. Two barriers
// a reduction instead of 2 + log2(ROW_THREADS). Subgroups are taken to be
// runs of consecutive local indices, as the cooperative-matrix kernels
// also take them. The launcher substitutes this file for rows.wgsl (see
// `kernel_source`).

override ROW_THREADS: u32 = 256u;

// one slot per subgroup: ROW_THREADS / width <= 256 / 4
var<workgroup> part: array<f32, 64>;

// Puts `r`, this subgroup's result, in the subgroup's slot and returns the
// number of slots once every slot is written.
fn share(r: f32, lid: u32) -> u32 {
    let width = subgroupAdd(1u);
    if lid % width == 0u {
        part[lid / width] = r;
    }
    workgroupBarrier();
    return max(ROW_THREADS / width, 1u);
}

fn workgroup_max(v: f32, lid: u32) -> f32 {
    let slots = share(subgroupMax(v), lid);
    var r = part[0];
    for (var i = 1u; i < slots; i++) {
        r = max(r, part[i]);
    }
    workgroupBarrier();
    return r;
}

fn workgroup_sum(v: f32, lid: u32) -> f32 {
    let slots = share(subgroupAdd(v), lid);
    var r = part[0];
    for (var i = 1u; i < slots; i++) {
        r += part[i];
    }
    workgroupBarrier();
    return r;
}
