// store.wgsl — the output side of the elementwise kernels. Thread `u` owns
// output unit `u`: one word for f32 and u32, one word holding two elements
// for f16 and bf16 (so no two threads write the same word), two words for
// i64. It asks the kernel's value_at(e) for the value of element `e`.

override OUT_DT: u32 = 0u;

fn out_units(n: u32) -> u32 {
    if OUT_DT == 1u || OUT_DT == 2u {
        return (n + 1u) / 2u;
    }
    return n;
}

fn write_unit(u: u32, n: u32) {
    switch OUT_DT {
        case 1u, 2u: {
            let e = 2u * u;
            if e >= n {
                return;
            }
            let lo = value_at(e);
            var hi = 0.0;
            if e + 1u < n {
                hi = value_at(e + 1u);
            }
            dst[u] = encode_pair(lo, hi, OUT_DT);
        }
        case 3u: {
            if u >= n {
                return;
            }
            // negative values saturate to 0 as on the CPU (GL would wrap)
            dst[u] = u32(max(value_at(u), 0.0));
        }
        case 4u: {
            if u >= n {
                return;
            }
            let i = i32(value_at(u));
            dst[2u * u] = bitcast<u32>(i);
            dst[2u * u + 1u] = select(0u, 0xffffffffu, i < 0);
        }
        default: {
            if u >= n {
                return;
            }
            dst[u] = bitcast<u32>(value_at(u));
        }
    }
}
