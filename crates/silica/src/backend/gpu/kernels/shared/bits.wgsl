// bits.wgsl — bitwise element moves for the copy, cat and index_select
// kernels (any dtype, no conversion). ELEM_BYTES is 2, 4 or 8. The kernel
// declares `src` and `dst` and defines src_elem(e), the storage index in
// `src` of output element `e`, or NONE for an element to set to zero.

override ELEM_BYTES: u32 = 4u;
const NONE: u32 = 0xffffffffu;

fn fetch_half(i: u32) -> u32 {
    if i == NONE {
        return 0u;
    }
    return (src[i >> 1u] >> ((i & 1u) * 16u)) & 0xffffu;
}

fn fetch_word(i: u32) -> u32 {
    if i == NONE {
        return 0u;
    }
    return src[i];
}

// Threads needed for `n` output elements: one per output word (two 16-bit
// elements), or one per element.
fn bit_units(n: u32) -> u32 {
    if ELEM_BYTES == 2u {
        return (n + 1u) / 2u;
    }
    return n;
}

// Writes output unit `u` of a contiguous output of `n` elements.
fn move_unit(u: u32, n: u32) {
    move_unit_at(u, n, 0u);
}

// move_unit into an output that starts `base` words into `dst` (the
// launcher keeps 16-bit outputs at even element offsets and even lengths
// there, so no word is shared with elements outside the output).
fn move_unit_at(u: u32, n: u32, base: u32) {
    if ELEM_BYTES == 2u {
        let e = 2u * u;
        if e >= n {
            return;
        }
        var w = fetch_half(src_elem(e));
        if e + 1u < n {
            w |= fetch_half(src_elem(e + 1u)) << 16u;
        }
        dst[base + u] = w;
    } else if ELEM_BYTES == 8u {
        if u >= n {
            return;
        }
        let i = src_elem(u);
        if i == NONE {
            dst[base + 2u * u] = 0u;
            dst[base + 2u * u + 1u] = 0u;
        } else {
            dst[base + 2u * u] = src[2u * i];
            dst[base + 2u * u + 1u] = src[2u * i + 1u];
        }
    } else {
        if u >= n {
            return;
        }
        dst[base + u] = fetch_word(src_elem(u));
    }
}
