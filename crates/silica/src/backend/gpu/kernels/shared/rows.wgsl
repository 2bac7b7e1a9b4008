// rows.wgsl — workgroup-wide max and sum of one value per thread, for the
// kernels that reduce one row per workgroup of ROW_THREADS threads (a
// power of two up to 256).

override ROW_THREADS: u32 = 256u;

var<workgroup> part: array<f32, 256>;

fn workgroup_max(v: f32, lid: u32) -> f32 {
    part[lid] = v;
    workgroupBarrier();
    for (var s = ROW_THREADS / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            part[lid] = max(part[lid], part[lid + s]);
        }
        workgroupBarrier();
    }
    let r = part[0];
    workgroupBarrier();
    return r;
}

fn workgroup_sum(v: f32, lid: u32) -> f32 {
    part[lid] = v;
    workgroupBarrier();
    for (var s = ROW_THREADS / 2u; s > 0u; s >>= 1u) {
        if lid < s {
            part[lid] += part[lid + s];
        }
        workgroupBarrier();
    }
    let r = part[0];
    workgroupBarrier();
    return r;
}
