// qgemv_i8.wgsl — dst = x @ wᵀ for M <= 8 rows of x (decode), w in Q8_0, Q4_0,
// Q4_1, Q4_K, Q5_K or Q6_K, with integer dot products of 4 bytes
// (`dot4I8Packed`, one instruction where the driver has them: dp4a on
// NVIDIA). Every workgroup first rounds x to 8 bits per block of 32 into
// workgroup memory, as GGML's Q8_0 does (scale max |x| / 127), four
// threads a block, or one where x has more blocks than a quarter of the
// workgroup's threads. Then each lane takes whole weight blocks of its
// set's R rows (lane l of LANES: blocks l, l + LANES, ...), so that a
// subgroup's loads of a row are one contiguous run, and sums each block as
// one integer: 8 packed products (Q8_0's bytes, or Q4_0/Q4_1's low and
// high nibbles against x's first and second 16 values), scaled once. A
// lane fetches its next blocks' words before it works on the current ones
// (the first ones before x is rounded), or with DEPTH 2 keeps two units'
// words in flight. The K formats' lanes take 64
// values at a time: a pair of Q4_K/Q5_K groups (32 bytes of nibbles, the
// low ones the first group, the high ones the second; Q5_K adds a bit of
// each value from its 32 bytes of high bits), or Q6_K's groups 2j and
// 2j + 2 of a half block (its low nibbles and bits 2j.. of the high pairs
// the first, its high nibbles and bits 2j + 4.. the second), whose 6-bit
// values, less 32, are packed as signed bytes. About 1.4 operations a
// weight for Q4_0, against 5-6 in qgemv.wgsl's f32 products
// (docs/tuning.md, "8-bit activations"). The fusions and the final sum are
// qgemv_common.wgsl's.
//
// With M > 1 rows of x (a server's step of several sequences), each lane
// dots each weight unit with the M rows' blocks, so that a weight is loaded
// once for all rows (`sums_rows`). Where the M rows do not fit XB, x is
// rounded a slice of every row at a time.

// Blocks of x the workgroup holds: K / 32 at most with M = 1; with M > 1,
// all M rows' blocks, or a slice of LANES units of each row at least.
override XB: u32 = 512u;
// Units of each weight row a lane has in flight while it works on one: 1
// (`sums`) or 2 (`sums_deep`). See `integer_depth` in qmatmul.rs.
override DEPTH: u32 = 1u;

// The quants of block b of x, 32 bytes as 8 words in two vec4, and the
// block's scale d with d times the sum of its quants.
var<workgroup> xq: array<vec4<u32>, 2u * XB>;
var<workgroup> xd: array<vec2<f32>, XB>;

// The f16 scale `h` (16 bits) as f32 (subnormals exactly: see f16_at).
fn half_value(h: u32) -> f32 {
    if (h & 0x7c00u) == 0u {
        return f16_to_f32(h);
    }
    return unpack2x16float(h).x;
}

// Part t of the slice of x being rounded (t = 4b + q: values 8q..8q+7 of
// the slice's block b, that is block b0 + b % cb of row b / cb, where the
// slice holds blocks b0..b0 + cb - 1 of each row), times the norm weight
// with NORM; `ss` gets the part's sum of squares before the weight, in its
// row's slot.
fn x_part(t: u32, cb: u32, b0: u32, ss: ptr<function, RowSums>) -> array<vec4<f32>, 2> {
    let b = t >> 2u;
    var r = 0u;
    if M > 1u {
        r = b / cb;
    }
    // the element in its row
    let e = (b0 + b - r * cb) * 32u + (t & 3u) * 8u;
    let at = p.off_x + x_row(r) * p.k + e;
    var v = array<vec4<f32>, 2>(x4(at), x4(at + 4u));
    if NORM {
        let s = dot(v[0], v[0]) + dot(v[1], v[1]);
        // a constant index each (M is a constant), so ss stays in registers
        for (var i = 0u; i < M; i++) {
            if i == r {
                (*ss)[i] += s;
            }
        }
        v[0] *= g4(e);
        v[1] *= g4(e + 4u);
    }
    return v;
}

// Rounds the slice's nb blocks of x (see x_part) into xq and xd, four
// threads a block (8 values each), adding this thread's sums of squares
// of x to `ss` (for NORM). `partial` holds the
// parts' largest |x| and then their sums of quants, through workgroup
// memory and barriers: subgroup shuffles among the four threads are no
// faster, and without them the kernel needs no subgroups (docs/tuning.md,
// "Rounding x").
fn round_x4(lid: u32, nb: u32, cb: u32, b0: u32, ss: ptr<function, RowSums>) {
    for (var t0 = 0u; t0 < 4u * nb; t0 += WG) {
        let t = t0 + lid;
        let live = t < 4u * nb;
        var v = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
        if live {
            v = x_part(t, cb, b0, ss);
        }
        let a = max(abs(v[0]), abs(v[1]));
        partial[lid] = max(max(a.x, a.y), max(a.z, a.w));
        workgroupBarrier();
        let q0 = lid & ~3u;
        let amax = max(max(partial[q0], partial[q0 + 1u]), max(partial[q0 + 2u], partial[q0 + 3u]));
        let inv = select(0.0, 127.0 / amax, amax > 0.0);
        let lo = vec4<i32>(round(v[0] * inv));
        let hi = vec4<i32>(round(v[1] * inv));
        let sum = lo + hi;
        partial[WG + lid] = f32(sum.x + sum.y + sum.z + sum.w);
        if live {
            // words 2q, 2q + 1 of the block's 8
            let b = t >> 2u;
            let q = t & 3u;
            let w = vec2<u32>(pack4xI8(lo), pack4xI8(hi));
            if q < 2u {
                xq[2u * b][2u * q] = w.x;
                xq[2u * b][2u * q + 1u] = w.y;
            } else {
                xq[2u * b + 1u][2u * q - 4u] = w.x;
                xq[2u * b + 1u][2u * q - 3u] = w.y;
            }
        }
        workgroupBarrier();
        if live && (lid & 3u) == 0u {
            let s = partial[WG + lid] + partial[WG + lid + 1u] + partial[WG + lid + 2u] + partial[WG + lid + 3u];
            let d = amax / 127.0;
            xd[t >> 2u] = vec2<f32>(d, d * s);
        }
        workgroupBarrier();
    }
}

// As round_x4, one thread a block: no barrier but the last.
// Faster than round_x4 once round_x4 would need a second round, that is
// where x has more blocks than a quarter of the workgroup's threads
// (docs/tuning.md, "Rounding x").
fn round_x1(lid: u32, nb: u32, cb: u32, b0: u32, ss: ptr<function, RowSums>) {
    for (var b = lid; b < nb; b += WG) {
        var v: array<vec4<f32>, 8>;
        var a = vec4<f32>(0.0);
        for (var q = 0u; q < 4u; q++) {
            let h = x_part(4u * b + q, cb, b0, ss);
            v[2u * q] = h[0];
            v[2u * q + 1u] = h[1];
            a = max(a, max(abs(h[0]), abs(h[1])));
        }
        let amax = max(max(a.x, a.y), max(a.z, a.w));
        let inv = select(0.0, 127.0 / amax, amax > 0.0);
        var sum = vec4<i32>(0);
        var w: array<u32, 8>;
        for (var i = 0u; i < 8u; i++) {
            let r = vec4<i32>(round(v[i] * inv));
            sum += r;
            w[i] = pack4xI8(r);
        }
        xq[2u * b] = vec4<u32>(w[0], w[1], w[2], w[3]);
        xq[2u * b + 1u] = vec4<u32>(w[4], w[5], w[6], w[7]);
        let d = amax / 127.0;
        xd[b] = vec2<f32>(d, d * f32(sum.x + sum.y + sum.z + sum.w));
    }
    workgroupBarrier();
}

// Rounds the slice's nb blocks of x (see x_part) into xq and xd, adding
// this thread's sums of squares of x to `ss` (for NORM).
fn round_x(lid: u32, nb: u32, cb: u32, b0: u32, ss: ptr<function, RowSums>) {
    if nb > WG / 4u {
        round_x1(lid, nb, cb, b0, ss);
    } else {
        round_x4(lid, nb, cb, b0, ss);
    }
}

// The word at bytes 2..5 of (u, v): the quant words of blocks that start
// 2 bytes past a word.
fn funnel(u: u32, v: u32) -> u32 {
    return (u >> 16u) | (v << 16u);
}

// A lane's unit of work in a weight row: a block of the simple formats
// (32 values), or 64 values of a K format's block of 256 (see the top).
fn unit_blocks() -> u32 {
    if FMT >= 5u {
        return 2u;
    }
    return 1u;
}

// Byte offset in its row of the block that holds unit u.
fn unit_block(u: u32) -> u32 {
    if FMT >= 5u {
        return (u >> 2u) * block_bytes();
    }
    return u * block_bytes();
}

// Words a unit's products read, at most (Q6_K's).
const UNIT_WORDS: u32 = 22u;

// Words at..at + n - 1 into w from index i0. A run that may start 2 bytes
// past a word (Q6_K's) is fetched with one word more than it holds, so
// that `run_word` can join each pair with `funnel`.
fn fetch_run(w: ptr<function, array<u32, UNIT_WORDS>>, i0: u32, at: u32, n: u32) {
    for (var i = 0u; i < n; i++) {
        (*w)[i0 + i] = src_w[at + i];
    }
}

// Words at..at + 4 n - 1 into w from index i0, at a multiple of 4 (Q4_K's
// 144-byte and Q5_K's 176-byte blocks, and their runs, start on 16 bytes),
// in n loads of 16 bytes, a quarter of the loads of one a word
// (docs/tuning.md, "K-format weight loads").
fn fetch_run4(w: ptr<function, array<u32, UNIT_WORDS>>, i0: u32, at: u32, n: u32) {
    for (var i = 0u; i < n; i++) {
        let v = src_w4[(at >> 2u) + i];
        (*w)[i0 + 4u * i] = v.x;
        (*w)[i0 + 4u * i + 1u] = v.y;
        (*w)[i0 + 4u * i + 2u] = v.z;
        (*w)[i0 + 4u * i + 3u] = v.w;
    }
}

// The words that unit u of the block at byte `base` needs: words a (the
// one holding the block's first byte) to a + 8 (Q8_0; 5 for Q4_0, Q4_1);
// Q4_K's d and dmin, its 12 scale bytes and the unit's 8 words of nibbles
// (Q5_K: then its 8 words of high bits); Q6_K's 9 words from the unit's
// low nibbles, 9 from its high pairs, 3 from its half's scales and the
// one that holds d (one word more a run, for blocks that start 2 bytes
// past a word).
fn unit_words(base: u32, u: u32) -> array<u32, UNIT_WORDS> {
    var w: array<u32, UNIT_WORDS>;
    let a = base >> 2u;
    if FMT == 7u {
        let h = (u >> 1u) & 1u;
        fetch_run(&w, 0u, a + 16u * h + 8u * (u & 1u), 9u);
        fetch_run(&w, 9u, a + 32u + 8u * h, 9u);
        fetch_run(&w, 18u, a + 48u + 2u * h, 3u);
        w[21] = src_w[a + 52u];
        return w;
    }
    if FMT >= 5u {
        fetch_run4(&w, 0u, a, 1u);
        if FMT == 6u {
            fetch_run4(&w, 4u, a + 12u + 8u * (u & 3u), 2u);
            fetch_run4(&w, 12u, a + 4u, 2u);
        } else {
            fetch_run4(&w, 4u, a + 4u + 8u * (u & 3u), 2u);
        }
        return w;
    }
    var n = 5u;
    if FMT == 0u {
        n = 9u;
    }
    fetch_run(&w, 0u, a, n);
    return w;
}

// x's blocks of one unit: quants (two vec4 a block) and (scale, scale
// times the sum of quants).
struct XUnit {
    q: array<vec4<u32>, 4>,
    d: array<vec2<f32>, 2>,
}

// x's blocks of unit u, of the row whose block b is xq's block b + at
// (at may wrap around: b0 of a slice past the row's start is subtracted).
fn x_unit(u: u32, at: u32) -> XUnit {
    var x: XUnit;
    var b = vec2<u32>(u * unit_blocks(), u * unit_blocks() + 1u);
    if FMT == 7u {
        // groups 2j and 2j + 2 of half h of block u / 4 (j = u % 2)
        b.x = 8u * (u >> 2u) + 4u * ((u >> 1u) & 1u) + (u & 1u);
        b.y = b.x + 2u;
    }
    b += vec2<u32>(at);
    for (var i = 0u; i < unit_blocks(); i++) {
        x.q[2u * i] = xq[2u * b[i]];
        x.q[2u * i + 1u] = xq[2u * b[i] + 1u];
        x.d[i] = xd[b[i]];
    }
    return x;
}

// Integer dot product of 4 words of nibbles (mask m after a shift by sh)
// with a vec4 of x's quants; Q5_K ORs in each value's fifth bit, bit hsh
// of each byte of `hb`.
fn nib_dot(w: vec4<u32>, sh: u32, hb: vec4<u32>, hsh: u32, x: vec4<u32>) -> i32 {
    var v = (w >> vec4<u32>(sh)) & vec4<u32>(0x0f0f0f0fu);
    if FMT == 6u {
        v |= ((hb >> vec4<u32>(hsh)) & vec4<u32>(0x01010101u)) << vec4<u32>(4u);
    }
    return dot4I8Packed(v.x, x.x) + dot4I8Packed(v.y, x.y) + dot4I8Packed(v.z, x.z) + dot4I8Packed(v.w, x.w);
}

// Word i of a run of `w` from index i0 (see fetch_run).
fn run_word(w: array<u32, UNIT_WORDS>, i0: u32, i: u32, odd: bool) -> u32 {
    return select(w[i0 + i], funnel(w[i0 + i], w[i0 + i + 1u]), odd);
}

// Q6_K's 6-bit values of 4 bytes (low nibbles `lo`, high pairs at bit
// `sh` of each byte of `hi`), less 32, as signed bytes: each byte becomes
// q + 96 (no borrow), then flips its sign bit.
fn q6_bytes(lo: u32, hi: u32, sh: u32) -> u32 {
    let q = (lo & 0x0f0f0f0fu) | (((hi >> sh) & 0x03030303u) << 4u);
    return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// Unit u of a Q6_K block at byte `base` (words `w`, see unit_words):
// groups 2j and 2j + 2 (j = u % 2) of half h, each two runs of 16
// values with a signed 8-bit scale.
fn q6k_dot(base: u32, u: u32, w: array<u32, UNIT_WORDS>, x: XUnit) -> f32 {
    let odd = (base & 2u) != 0u;
    let j = u & 1u;
    // the half's scales 0-3 and 4-7; the unit's are bytes 2j, 2j + 1
    let sc = vec2<i32>(bitcast<i32>(run_word(w, 18u, 0u, odd)), bitcast<i32>(run_word(w, 18u, 1u, odd)));
    let d = half_value(select(w[21] & 0xffffu, w[21] >> 16u, odd));
    var s = vec4<i32>(0);
    for (var i = 0u; i < 8u; i++) {
        let lo = run_word(w, 0u, i, odd);
        let hi = run_word(w, 9u, i, odd);
        let a = dot4I8Packed(q6_bytes(lo, hi, 2u * j), x.q[i / 4u][i % 4u]);
        let b = dot4I8Packed(q6_bytes(lo >> 4u, hi, 2u * j + 4u), x.q[2u + i / 4u][i % 4u]);
        // values 0-15 of a group, then 16-31
        if i < 4u {
            s += vec4<i32>(a, 0, b, 0);
        } else {
            s += vec4<i32>(0, a, 0, b);
        }
    }
    let sa = extractBits(sc.x, 16u * j, 8u) * s.x + extractBits(sc.x, 16u * j + 8u, 8u) * s.y;
    let sb = extractBits(sc.y, 16u * j, 8u) * s.z + extractBits(sc.y, 16u * j + 8u, 8u) * s.w;
    return d * (x.d[0].x * f32(sa) + x.d[1].x * f32(sb));
}

// Dot product of unit u, whose block starts at byte `base` and whose words
// are `w`, with x's blocks.
fn unit_dot(base: u32, u: u32, w: array<u32, UNIT_WORDS>, x: XUnit) -> f32 {
    if FMT == 7u {
        return q6k_dot(base, u, w, x);
    }
    if FMT >= 5u {
        // groups g = 2j, 2j + 1 of the block (j = u % 4): 6-bit scales
        // and minimums as in quant_blocks.wgsl's scale_min_k4
        let j = u & 3u;
        let d = vec2<f32>(half_value(w[0] & 0xffffu), half_value(w[0] >> 16u));
        // scale bytes 2j % 4 and the next, two at a time: from w[1] and
        // w[2] (groups 0-3), or from w[3]'s nibbles and the top bits of
        // w[1] and w[2] (groups 4-7). Lanes of both kinds share a subgroup,
        // so both are computed and one selected: a branch would run its two
        // sides one after the other (docs/tuning.md, "K-format weight loads").
        let sh = 16u * (j & 1u);
        let a1 = (w[1] >> sh) & 0xffffu;
        let a2 = (w[2] >> sh) & 0xffffu;
        let a3 = (w[3] >> sh) & 0xffffu;
        let hi = j >= 2u;
        let scb = select(a1 & 0x3f3fu, (a3 & 0x0f0fu) | ((a1 & 0xc0c0u) >> 2u), hi);
        let mnb = select(a2 & 0x3f3fu, ((a3 >> 4u) & 0x0f0fu) | ((a2 & 0xc0c0u) >> 2u), hi);
        let sc = vec2<f32>(f32(scb & 0xffu), f32(scb >> 8u));
        let mn = vec2<f32>(f32(mnb & 0xffu), f32(mnb >> 8u));
        let q0 = vec4<u32>(w[4], w[5], w[6], w[7]);
        let q1 = vec4<u32>(w[8], w[9], w[10], w[11]);
        // Q5_K's high bits: bit 2j of each byte for group 2j, 2j + 1 next
        let h0 = vec4<u32>(w[12], w[13], w[14], w[15]);
        let h1 = vec4<u32>(w[16], w[17], w[18], w[19]);
        let s0 = f32(nib_dot(q0, 0u, h0, 2u * j, x.q[0]) + nib_dot(q1, 0u, h1, 2u * j, x.q[1]));
        let s1 = f32(nib_dot(q0, 4u, h0, 2u * j + 1u, x.q[2]) + nib_dot(q1, 4u, h1, 2u * j + 1u, x.q[3]));
        let prod = sc[0] * x.d[0].x * s0 + sc[1] * x.d[1].x * s1;
        let offs = mn[0] * x.d[0].y + mn[1] * x.d[1].y;
        return d.x * prod - d.y * offs;
    }
    // Q8_0 and Q4_0 blocks (34 and 18 bytes) start on even bytes: at a word
    // (scale in the low half, quants from byte 2) or 2 bytes past one
    // (scale in the high half, quants from the next word); Q4_1's 20
    // bytes always start on a word
    let odd = (base & 2u) != 0u;
    let d = half_value(select(w[0] & 0xffffu, w[0] >> 16u, odd));
    let xa = x.q[0];
    let xb = x.q[1];
    let ds = x.d[0];
    if FMT == 0u {
        var q: array<u32, 8>;
        for (var i = 0u; i < 8u; i++) {
            q[i] = select(funnel(w[i], w[i + 1u]), w[i + 1u], odd);
        }
        let s = dot4I8Packed(q[0], xa.x) + dot4I8Packed(q[1], xa.y) + dot4I8Packed(q[2], xa.z) + dot4I8Packed(q[3], xa.w)
            + dot4I8Packed(q[4], xb.x) + dot4I8Packed(q[5], xb.y) + dot4I8Packed(q[6], xb.z) + dot4I8Packed(q[7], xb.w);
        return d * ds.x * f32(s);
    }
    // byte j of the 16 holds value j in its low nibble, j + 16 in its high
    var q: array<u32, 4>;
    for (var i = 0u; i < 4u; i++) {
        if FMT == 1u {
            q[i] = select(funnel(w[i], w[i + 1u]), w[i + 1u], odd);
        } else {
            q[i] = w[i + 1u];
        }
    }
    let qv = vec4<u32>(q[0], q[1], q[2], q[3]);
    let s = f32(nib_dot(qv, 0u, qv, 0u, xa) + nib_dot(qv, 4u, qv, 0u, xb));
    if FMT == 1u {
        // values d (u - 8)
        return d * (ds.x * s - 8.0 * ds.y);
    }
    // Q4_1: values d u + m
    return fma(d * ds.x, s, half_value(w[0] >> 16u) * ds.y);
}

// A lane's R rows' words of one unit.
alias Words = array<array<u32, UNIT_WORDS>, 4>;

// Fetches the words of unit u of the rows at `row_at` into `buf` (unless
// u is past the row's end).
fn fetch_unit(u: u32, units: u32, row_at: array<u32, 4>, buf: ptr<function, Words>) {
    if u < units {
        for (var c = 0u; c < R; c++) {
            (*buf)[c] = unit_words(row_at[c] + unit_block(u), u);
        }
    }
}

// Adds unit u's products (words in `buf`) to acc, then refills `buf`
// with the unit 2 LANES further on.
fn unit_step(u: u32, units: u32, row_at: array<u32, 4>, buf: ptr<function, Words>, acc: ptr<function, Accs>) {
    if u < units {
        let x = x_unit(u, 0u);
        for (var c = 0u; c < R; c++) {
            (*acc)[c] += unit_dot(row_at[c] + unit_block(u), u, (*buf)[c], x);
        }
        fetch_unit(u + 2u * LANES, units, row_at, buf);
    }
}

// Rounds x into xq and xd and, with NORM, publishes 1 / rms(x) in inv_rms
// (every thread gets the sum; the final sums' barrier publishes it).
fn prepare_x(lid: u32, blocks: u32) {
    var ss: RowSums;
    round_x(lid, blocks, blocks, 0u, &ss);
    if NORM {
        let total = workgroup_sum(ss[0], lid);
        if lid == 0u {
            inv_rms[0] = inverseSqrt(total / f32(p.k) + bitcast<f32>(p.eps));
        }
    }
}

// The lane's sums with DEPTH 2: two buffers of words taken in turn (the
// first two units' fetched before x is rounded).
fn sums_deep(lid: u32, lane: u32, live: bool, blocks: u32, row_at: array<u32, 4>) -> Accs {
    let units = blocks / unit_blocks();
    var b0: Words;
    var b1: Words;
    if live {
        fetch_unit(lane, units, row_at, &b0);
        fetch_unit(lane + LANES, units, row_at, &b1);
    }
    let lr = fetch_low_rank(lid);
    prepare_x(lid, blocks);
    if LORA_IN {
        project_low_rank(lid, lr);
    }
    var acc: Accs;
    if live {
        for (var u = lane; u < units; u += 2u * LANES) {
            unit_step(u, units, row_at, &b0, &acc);
            unit_step(u + LANES, units, row_at, &b1, &acc);
        }
    }
    return acc;
}

// The lane's sums with DEPTH 1: the first unit's words are fetched before
// x is rounded, the next ones' before this ones' products, so that loads
// are in flight while the thread works. A loop of its own rather than
// sums_deep with one buffer: sums_deep's order (products, then the refill)
// and one function for both depths over shared buffers each make depth 1
// slower (docs/tuning.md, "Decode GEMV depth").
fn sums(lid: u32, lane: u32, live: bool, blocks: u32, row_at: array<u32, 4>) -> Accs {
    let units = blocks / unit_blocks();
    var next: Words;
    if live {
        fetch_unit(lane, units, row_at, &next);
    }
    let lr = fetch_low_rank(lid);
    prepare_x(lid, blocks);
    if LORA_IN {
        project_low_rank(lid, lr);
    }
    var acc: Accs;
    if live {
        for (var u = lane; u < units; u += LANES) {
            let cur = next;
            fetch_unit(u + LANES, units, row_at, &next);
            let x = x_unit(u, 0u);
            for (var c = 0u; c < R; c++) {
                acc[c] += unit_dot(row_at[c] + unit_block(u), u, cur[c], x);
            }
        }
    }
    return acc;
}

// The lane's sums for M > 1 rows of x: each unit's words, fetched once
// (the next unit's before this one's products, as in `sums`), are dotted
// with the M rows' blocks. Where XB does not hold the M rows, x is rounded
// a slice at a time: the same blocks of every row, LANES units of each or
// a multiple (so that each lane's units stay lane, lane + LANES, ...), with
// a barrier before the next slice overwrites the last.
fn sums_rows(lid: u32, lane: u32, live: bool, blocks: u32, row_at: array<u32, 4>) -> Accs {
    let ub = unit_blocks();
    let units = blocks / ub;
    // blocks of each row in a slice
    var step = XB / M;
    if step < blocks {
        step = step / (LANES * ub) * (LANES * ub);
    }
    var next: Words;
    if live {
        fetch_unit(lane, units, row_at, &next);
    }
    if LORA_IN {
        project_low_rank(lid, fetch_low_rank(lid));
    }
    var ss: RowSums;
    var acc: Accs;
    for (var b0 = 0u; b0 < blocks; b0 += step) {
        if b0 > 0u {
            workgroupBarrier();
        }
        let cb = min(step, blocks - b0);
        round_x(lid, M * cb, cb, b0, &ss);
        if live {
            for (var u = b0 / ub + lane; u < (b0 + cb) / ub; u += LANES) {
                let cur = next;
                fetch_unit(u + LANES, units, row_at, &next);
                for (var r = 0u; r < M; r++) {
                    let x = x_unit(u, r * cb - b0);
                    for (var c = 0u; c < R; c++) {
                        acc[c * M + r] += unit_dot(row_at[c] + unit_block(u), u, cur[c], x);
                    }
                }
            }
        }
    }
    if NORM {
        publish_rms(lid, ss);
    }
    return acc;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    start_chunk(wid);
    let lane = lid % LANES;
    let col0 = (group_index(wid, nwg) * (WG / LANES) + lid / LANES) * OC;
    let blocks = p.k / 32u;
    let live = col0 < p.n;
    // byte offsets of the weight rows
    var row_at: array<u32, 4>;
    for (var c = 0u; c < R; c++) {
        row_at[c] = weight_row(col0, c) * p.row_bytes;
    }
    let early = residual_words(lane, col0);
    let lb = low_rank_words(lane, col0);
    var acc: Accs;
    if M > 1u {
        acc = sums_rows(lid, lane, live, blocks, row_at);
    } else if DEPTH > 1u {
        acc = sums_deep(lid, lane, live, blocks, row_at);
    } else {
        acc = sums(lid, lane, live, blocks, row_at);
    }
    finish(lid, lane, col0, acc, early, lb);
}
