//! Attention in f32 on the CPU: the fast path of [`super::nn::attention`]
//! (taken with the 8-bit products, see `crate::cpu_int8_activations`),
//! whose exact f64 version stays the reference of the GPU kernels.
//!
//! An encoder's attention of 16 query positions or more (no causal mask)
//! goes through two `gemm` products per batch row and head, in blocks of
//! queries. Otherwise, one task per query position (all its heads): the scores of the visible
//! keys (a causal query never looks at later keys), their exponentials
//! through a polynomial that vectorizes, and the weighted sum of the value
//! rows. The loops are written for the compiler to vectorize, and compiled
//! a second time for AVX2/FMA and AVX-512 where the processor has them.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::PAR_MIN;

/// The inputs of one attention: q contiguous, k and v as views whose rows
/// of `d` are contiguous (a KV cache is read where it lies).
pub(super) struct Inputs<'a> {
    /// [b, tq, h, d]
    pub q: &'a [f32],
    /// [b, tk, kvh, d] at `kv_strides`
    pub k: &'a [f32],
    /// [b, tk, kvh, d] at `kv_strides`
    pub v: &'a [f32],
    /// The strides of k and v over (batch, key, head); each row of `d` is contiguous.
    pub kv_strides: [usize; 3],
    /// The compact mask and its strides over (batch, head, query, key).
    pub mask: Option<(&'a [f32], &'a [usize])>,
    /// b, tq, h, d, tk, kvh
    pub dims: [usize; 6],
}

impl Inputs<'_> {
    /// The contiguous strides of k and v of `dims`.
    pub fn packed_kv(dims: [usize; 6]) -> [usize; 3] {
        let [_, _, _, d, tk, kvh] = dims;
        [tk * kvh * d, kvh * d, d]
    }
}

/// `y` [b, tq, h, d] = softmax(q kᵀ · scale + mask) v, keys after a
/// query's position hidden when `causal` (with tk - tq cached positions
/// before the first query).
pub(super) fn attention_f32(x: &Inputs<'_>, scale: f32, causal: bool, y: &mut [f32]) {
    attention_on(crate::cpu_isa(), x, scale, causal, y)
}

/// [`attention_f32`] through the kernel of `isa` (at most what the processor has).
fn attention_on(isa: crate::CpuIsa, x: &Inputs<'_>, scale: f32, causal: bool, y: &mut [f32]) {
    let [_, _, h, d, tk, kvh] = x.dims;
    if d == 0 || h == 0 || kvh == 0 {
        return;
    }
    // one task per query position and KV head: the heads that share the
    // KV head read each key and value row once
    if x.dims[1] >= BLOCK_MIN_TQ && !causal {
        return blocks(isa, x, scale, y);
    }
    let per_kv = h / kvh;
    let chunk = per_kv * d;
    let run = |scores: &mut Vec<f32>, t: usize, o: &mut [f32]| {
        group(
            isa,
            x,
            scale,
            causal,
            t / kvh,
            t % kvh,
            (t % kvh) * per_kv,
            scores,
            o,
        );
    };
    if y.len() >= PAR_MIN {
        y.par_chunks_mut(chunk)
            .enumerate()
            .for_each_init(Vec::new, |s, (t, o)| run(s, t, o));
    } else if y.len() * tk >= DECODE_PAR_MIN {
        // a decode step over a long context: on the spinning pool, a task
        // per query head where the KV heads are too few to keep every
        // thread busy (SmolLM2's 3 on 2 threads: one thread did two
        // thirds); each head then reads its KV head's rows itself
        if per_kv > 1 && y.len() / chunk < 2 * rayon::current_num_threads() {
            super::spin::for_each_chunk(y, d, |t, o| {
                let (pos, hi) = (t / h, t % h);
                SCORES
                    .with_borrow_mut(|s| group(isa, x, scale, causal, pos, hi / per_kv, hi, s, o));
            });
        } else {
            super::spin::for_each_chunk(y, chunk, |t, o| {
                SCORES.with_borrow_mut(|s| run(s, t, o));
            });
        }
    } else {
        let mut scores = Vec::new();
        for (t, o) in y.chunks_mut(chunk).enumerate() {
            run(&mut scores, t, o);
        }
    }
}

/// Query positions from which each (batch row, head) of a non-causal
/// attention (an encoder's) goes through two matrix products (scores, then
/// the weighted values) instead of one task per position: the queries
/// share the packing of their keys (docs/tuning.md, "CPU attention").
const BLOCK_MIN_TQ: usize = 16;

/// Query positions a block of [`blocks`] takes (its scores stay in the
/// cache).
const QUERY_BLOCK: usize = 64;

/// A pointer to `y` shared by tasks that write disjoint elements of it.
#[derive(Clone, Copy)]
struct Out(*mut f32);
impl Out {
    /// The pointer `i` elements on (a method, so that closures capture the
    /// whole `Out` rather than its raw pointer).
    ///
    /// # Safety
    /// As `pointer::add`.
    unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: as the caller's
        unsafe { self.0.add(i) }
    }
}

// SAFETY: the tasks that share it write disjoint elements (see `blocks`)
unsafe impl Send for Out {}
// SAFETY: as above
unsafe impl Sync for Out {}

/// [`attention_on`] without a causal mask for many query positions: per
/// (batch row, head), `S = scale · Q Kᵀ` and `Y = softmax(S + mask) V`
/// through `gemm`.
fn blocks(isa: crate::CpuIsa, x: &Inputs<'_>, scale: f32, y: &mut [f32]) {
    let [b, tq, h, d, tk, kvh] = x.dims;
    if y.is_empty() {
        return;
    }
    let group = h / kvh;
    let [sb, sj, sh] = x.kv_strides;
    assert!(x.q.len() >= b * tq * h * d && y.len() == b * tq * h * d);
    // the last batch row's last KV head's last key ends inside k and v
    let end = (b - 1) * sb + (kvh - 1) * sh + tk.saturating_sub(1) * sj + d;
    assert!(
        tk == 0 || (end <= x.k.len() && end <= x.v.len()),
        "attention rows out of bounds"
    );
    let out = Out(y.as_mut_ptr());
    let task = |s: &mut Vec<f32>, t: usize| {
        let (bi, hi) = (t / h, t % h);
        let kv = bi * sb + hi / group * sh;
        let hd = (h * d) as isize;
        for i0 in (0..tq).step_by(QUERY_BLOCK) {
            let rows = (tq - i0).min(QUERY_BLOCK);
            let first = ((bi * tq + i0) * h + hi) * d;
            s.clear();
            s.resize(rows * tk, 0.0);
            if tk > 0 {
                // SAFETY: q's rows first + i·h·d (i < rows) hold d values, k's
                // rows kv + j·sj (j < tk ≤ tk) hold d values (asserted
                // above), s holds rows·tk
                unsafe {
                    gemm::gemm(
                        rows,
                        tk,
                        d,
                        s.as_mut_ptr(),
                        1,
                        tk as isize,
                        false,
                        x.q.as_ptr().add(first),
                        1,
                        hd,
                        x.k.as_ptr().add(kv),
                        sj as isize,
                        1,
                        0.0,
                        scale,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                };
            }
            softmax_rows(isa, x, [bi, hi, i0], s);
            // SAFETY: as above for v; y's rows first + i·h·d hold d values,
            // and no other task writes them (each (bi, hi) owns its rows'
            // head slice)
            unsafe {
                gemm::gemm(
                    rows,
                    d,
                    tk,
                    out.at(first),
                    1,
                    hd,
                    false,
                    s.as_ptr(),
                    1,
                    tk as isize,
                    x.v.as_ptr().add(kv),
                    1,
                    sj as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            };
        }
    };
    if y.len() * tk >= DECODE_PAR_MIN {
        (0..b * h)
            .into_par_iter()
            .for_each_init(Vec::new, |s, t| task(s, t));
    } else {
        let mut s = Vec::new();
        (0..b * h).for_each(|t| task(&mut s, t));
    }
}

/// The rows of `s` [rows, tk] (the scores of head `hi` of batch row `bi`
/// for queries `i0..`; `at` = [bi, hi, i0]) ← their softmax after the mask.
fn softmax_rows(isa: crate::CpuIsa, x: &Inputs<'_>, at: [usize; 3], s: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has
            return unsafe { x86::softmax_rows_avx512(x, at, s) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { x86::softmax_rows_avx2(x, at, s) };
        }
    }
    let _ = isa;
    softmax_rows_any::<FMA_IN_TARGET>(x, at, s)
}

#[inline(always)]
fn softmax_rows_any<const FUSED: bool>(x: &Inputs<'_>, at: [usize; 3], s: &mut [f32]) {
    let [bi, hi, i0] = at;
    let tk = x.dims[4];
    if tk == 0 {
        return;
    }
    for (r, row) in s.chunks_exact_mut(tk).enumerate() {
        add_mask(x, bi, hi, i0 + r, row);
        let inv = softmax_in_place::<FUSED>(row);
        for p in row.iter_mut() {
            *p *= inv;
        }
    }
}

/// Multiply-adds (queries' values times keys) from which a step of few
/// query positions is split over threads.
const DECODE_PAR_MIN: usize = 1 << 16;

thread_local! {
    /// The scores of a task on the spinning pool.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Heads `first..` of query position `pos` (batch-major), which read KV
/// head `kv`, into `o` [heads, d]: all the heads that share the KV head, or
/// one of them.
#[allow(clippy::too_many_arguments)]
fn group(
    isa: crate::CpuIsa,
    x: &Inputs<'_>,
    scale: f32,
    causal: bool,
    pos: usize,
    kv: usize,
    first: usize,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has, which covers
            // the features the function is compiled for
            return unsafe { x86::group_avx512(x, scale, causal, pos, kv, first, scores, o) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { x86::group_avx2(x, scale, causal, pos, kv, first, scores, o) };
        }
    }
    group_any::<FMA_IN_TARGET>(x, scale, causal, pos, kv, first, scores, o)
}

/// Where query position `pos` is: its batch, its row, and how many keys
/// it sees.
#[inline(always)]
fn place(x: &Inputs<'_>, causal: bool, pos: usize) -> (usize, usize, usize) {
    let [_, tq, _, _, tk, _] = x.dims;
    let (bi, i) = (pos / tq, pos % tq);
    (bi, i, if causal { i + (tk - tq) + 1 } else { tk })
}

/// Adds the mask of head `hi` to `scores` of query `(bi, i)`.
#[inline(always)]
fn add_mask(x: &Inputs<'_>, bi: usize, hi: usize, i: usize, scores: &mut [f32]) {
    if let Some((m, ms)) = x.mask {
        let at = bi * ms[0] + hi * ms[1] + i * ms[2];
        for (j, s) in scores.iter_mut().enumerate() {
            *s += m[at + j * ms[3]];
        }
    }
}

/// `o` ← the softmax of `x` (one row, f32), through the widest kernel
/// `isa` allows.
pub(super) fn softmax_row(isa: crate::CpuIsa, x: &[f32], o: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= crate::CpuIsa::Avx512 {
            // SAFETY: cpu_isa is never above what the processor has
            return unsafe { x86::softmax_row_avx512(x, o) };
        }
        if isa >= crate::CpuIsa::Avx2 {
            // SAFETY: as above
            return unsafe { x86::softmax_row_avx2(x, o) };
        }
    }
    let _ = isa;
    softmax_row_any::<FMA_IN_TARGET>(x, o)
}

#[inline(always)]
fn softmax_row_any<const FUSED: bool>(x: &[f32], o: &mut [MaybeUninit<f32>]) {
    // a NaN makes the whole row NaN, as on the exact path and in PyTorch
    // (the exponential here gives 0 for it)
    if x.iter().fold(false, |a, v| a | v.is_nan()) {
        for p in o.iter_mut() {
            p.write(f32::NAN);
        }
        return;
    }
    let max = row_max(x);
    for (p, &v) in o.iter_mut().zip(x) {
        p.write(exp::<FUSED>(v - max));
    }
    // SAFETY: o has x's length (the caller's rows), so every element was
    // written just above; MaybeUninit<f32> has f32's layout
    let o = unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) };
    // 0 / 0 = NaN when every entry is -inf, as in PyTorch
    // (64 lanes: four independent vectors; the attention kernels keep the
    // 16 lanes of `sum`, whose order a model's activations were checked in)
    let inv = 1.0 / super::nn::lanes_sum::<64>(o, |v| v);
    for p in o.iter_mut() {
        *p *= inv;
    }
}

/// `scores` ← their softmax's numerators; returns 1 / their sum.
#[inline(always)]
fn softmax_in_place<const FUSED: bool>(scores: &mut [f32]) -> f32 {
    let max = row_max(scores);
    for s in scores.iter_mut() {
        *s = exp::<FUSED>(*s - max);
    }
    // 0 / 0 = NaN when no key is visible, as in PyTorch
    1.0 / sum(scores)
}

/// Key and value rows the attention kernels ask of the memory ahead of
/// their use: a long context's rows are not in the cache when their turn
/// comes (docs/tuning.md, "CPU attention").
const ROWS_AHEAD: usize = 32;

/// Asks for the cache lines of the `d` values at `at` of `t` (nothing
/// where the target has no stable prefetch: aarch64's is unstable in Rust,
/// and the Apple cores' own prefetchers follow such strides).
#[inline(always)]
fn prefetch_row(t: &[f32], at: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let p = t.as_ptr().wrapping_add(at);
        for c in (0..d).step_by(16) {
            // SAFETY: a prefetch never faults, whatever the address (SSE is
            // part of every x86-64 target)
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    p.wrapping_add(c).cast(),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (t, at, d);
}

/// The portable kernel: every key and value row read once for all the
/// heads of its KV head, and asked for [`ROWS_AHEAD`] rows ahead (at a
/// long context the rows come from memory).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn group_any<const FUSED: bool>(
    x: &Inputs<'_>,
    scale: f32,
    causal: bool,
    pos: usize,
    kv: usize,
    first: usize,
    scores: &mut Vec<f32>,
    o: &mut [f32],
) {
    let [_, _, h, d, _, _] = x.dims;
    let (bi, i, n) = place(x, causal, pos);
    let group = o.len() / d.max(1);
    // the group's scores, then 1 / their sums
    scores.clear();
    scores.resize(group * n + group, 0.0);
    let (scores, inv) = scores.split_at_mut(group * n);
    let [sb, sj, sh] = x.kv_strides;
    let at = |j: usize| bi * sb + j * sj + kv * sh;
    let q = |g: usize| &x.q[(pos * h + first + g) * d..][..d];
    for j in 0..n {
        prefetch_row(x.k, at(j + ROWS_AHEAD), d);
        let k = &x.k[at(j)..][..d];
        for g in 0..group {
            scores[g * n + j] = dot(q(g), k) * scale;
        }
    }
    for (g, f) in inv.iter_mut().enumerate() {
        let s = &mut scores[g * n..(g + 1) * n];
        add_mask(x, bi, first + g, i, s);
        *f = softmax_in_place::<FUSED>(s);
    }
    o.fill(0.0);
    for j in 0..n {
        prefetch_row(x.v, at(j + ROWS_AHEAD), d);
        let v = &x.v[at(j)..][..d];
        for (g, o) in o.chunks_exact_mut(d).enumerate() {
            let p = scores[g * n + j];
            for (a, &v) in o.iter_mut().zip(v) {
                *a = madd::<FUSED>(p, v, *a);
            }
        }
    }
    for (o, &f) in o.chunks_exact_mut(d).zip(inv.iter()) {
        for a in o.iter_mut() {
            *a *= f;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 and AVX2 kernels (one body, written twice): up to 4 (2)
    //! heads of a KV head at once, so that each key and value row is read
    //! once for all of them; the scores of 4 keys summed across lanes
    //! together.

    use super::{Inputs, ROWS_AHEAD, add_mask, place, prefetch_row, softmax_in_place};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn softmax_rows_avx512(x: &Inputs<'_>, at: [usize; 3], s: &mut [f32]) {
        super::softmax_rows_any::<true>(x, at, s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax_rows_avx2(x: &Inputs<'_>, at: [usize; 3], s: &mut [f32]) {
        super::softmax_rows_any::<true>(x, at, s)
    }

    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
    pub(super) fn softmax_row_avx512(x: &[f32], o: &mut [std::mem::MaybeUninit<f32>]) {
        super::softmax_row_any::<true>(x, o)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn softmax_row_avx2(x: &[f32], o: &mut [std::mem::MaybeUninit<f32>]) {
        super::softmax_row_any::<true>(x, o)
    }

    /// Heads handled together (their accumulators stay in registers).
    const HB: usize = 4;
    /// The same with AVX2's 16 registers.
    const HB2: usize = 2;

    #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn group_avx512(
        x: &Inputs<'_>,
        scale: f32,
        causal: bool,
        pos: usize,
        kv: usize,
        first: usize,
        scores: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        let [_, _, h, d, _, _] = x.dims;
        let (bi, i, n) = place(x, causal, pos);
        let group = o.len() / d.max(1);
        let [sb, sj, sh] = x.kv_strides;
        let base = bi * sb + kv * sh;
        // the last key's row ends inside k and v (checked once, so that
        // the loads below stay inside them; the op layer checked the shapes)
        let end = base + n.saturating_sub(1) * sj + d;
        assert!(
            n == 0 || (end <= x.k.len() && end <= x.v.len()),
            "attention rows out of bounds"
        );
        let chunks = d.div_ceil(16);
        // lanes of the last chunk of 16
        let tail: __mmask16 = if d % 16 == 0 {
            0xffff
        } else {
            (1 << (d % 16)) - 1
        };
        let mask = |c: usize| if c + 1 == chunks { tail } else { 0xffff };
        scores.clear();
        // the group's scores, then 1 / their sums
        scores.resize(group * n + group, 0.0);
        for h0 in (0..group).step_by(HB) {
            let hb = (group - h0).min(HB);
            let q = |g: usize| x.q[(pos * h + first + h0 + g) * d..].as_ptr();
            // scores: 4 keys at a time
            let mut j = 0;
            while j + 4 <= n {
                let mut acc = [[_mm512_setzero_ps(); 4]; HB];
                for kk in 0..4 {
                    prefetch_row(x.k, base + (j + kk + ROWS_AHEAD) * sj, d);
                }
                for c in 0..chunks {
                    let m = mask(c);
                    let mut ks = [_mm512_setzero_ps(); 4];
                    for (kk, kv) in ks.iter_mut().enumerate() {
                        // SAFETY: rows of d values from checked starts
                        *kv = unsafe {
                            _mm512_maskz_loadu_ps(
                                m,
                                x.k.as_ptr().add(base + (j + kk) * sj + 16 * c),
                            )
                        };
                    }
                    for (g, a) in acc.iter_mut().enumerate().take(hb) {
                        // SAFETY: q's rows hold d values
                        let qv = unsafe { _mm512_maskz_loadu_ps(m, q(g).add(16 * c)) };
                        for kk in 0..4 {
                            a[kk] = _mm512_fmadd_ps(qv, ks[kk], a[kk]);
                        }
                    }
                }
                for (g, a) in acc.iter().enumerate().take(hb) {
                    let s = _mm_mul_ps(sum4(a), _mm_set1_ps(scale));
                    // SAFETY: scores hold group * n values
                    unsafe { _mm_storeu_ps(scores.as_mut_ptr().add((h0 + g) * n + j), s) };
                }
                j += 4;
            }
            for j in j..n {
                for g in 0..hb {
                    let mut a = _mm512_setzero_ps();
                    for c in 0..chunks {
                        let m = mask(c);
                        // SAFETY: as above
                        a = unsafe {
                            _mm512_fmadd_ps(
                                _mm512_maskz_loadu_ps(m, q(g).add(16 * c)),
                                _mm512_maskz_loadu_ps(m, x.k.as_ptr().add(base + j * sj + 16 * c)),
                                a,
                            )
                        };
                    }
                    scores[(h0 + g) * n + j] = _mm512_reduce_add_ps(a) * scale;
                }
            }
        }
        let (scores, inv) = scores.split_at_mut(group * n);
        for (g, f) in inv.iter_mut().enumerate() {
            let s = &mut scores[g * n..(g + 1) * n];
            add_mask(x, bi, first + g, i, s);
            *f = softmax_in_place::<true>(s);
        }
        // the weighted sums of the value rows: 4 chunks of 16 of up to 4
        // heads in registers
        for h0 in (0..group).step_by(HB) {
            let hb = (group - h0).min(HB);
            for c0 in (0..chunks).step_by(4) {
                let cs = (chunks - c0).min(4);
                let mut acc = [[_mm512_setzero_ps(); 4]; HB];
                for j in 0..n {
                    let row = base + j * sj;
                    prefetch_row(x.v, row + ROWS_AHEAD * sj + 16 * c0, 16 * cs);
                    let mut vs = [_mm512_setzero_ps(); 4];
                    for (cc, v) in vs.iter_mut().enumerate().take(cs) {
                        let c = c0 + cc;
                        // SAFETY: as above
                        *v = unsafe {
                            _mm512_maskz_loadu_ps(mask(c), x.v.as_ptr().add(row + 16 * c))
                        };
                    }
                    for (g, a) in acc.iter_mut().enumerate().take(hb) {
                        let p = _mm512_set1_ps(scores[(h0 + g) * n + j]);
                        for (a, &v) in a.iter_mut().zip(&vs).take(cs) {
                            *a = _mm512_fmadd_ps(p, v, *a);
                        }
                    }
                }
                for (g, a) in acc.iter().enumerate().take(hb) {
                    let f = _mm512_set1_ps(inv[h0 + g]);
                    for (cc, &a) in a.iter().enumerate().take(cs) {
                        let c = c0 + cc;
                        // SAFETY: o holds group rows of d values
                        unsafe {
                            _mm512_mask_storeu_ps(
                                o.as_mut_ptr().add((h0 + g) * d + 16 * c),
                                mask(c),
                                _mm512_mul_ps(a, f),
                            )
                        };
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn group_avx2(
        x: &Inputs<'_>,
        scale: f32,
        causal: bool,
        pos: usize,
        kv: usize,
        first: usize,
        scores: &mut Vec<f32>,
        o: &mut [f32],
    ) {
        let [_, _, h, d, _, _] = x.dims;
        let (bi, i, n) = place(x, causal, pos);
        let group = o.len() / d.max(1);
        let [sb, sj, sh] = x.kv_strides;
        let base = bi * sb + kv * sh;
        // the last key's row ends inside k and v (checked once, so that
        // the loads below stay inside them; the op layer checked the shapes)
        let end = base + n.saturating_sub(1) * sj + d;
        assert!(
            n == 0 || (end <= x.k.len() && end <= x.v.len()),
            "attention rows out of bounds"
        );
        let chunks = d.div_ceil(8);
        // lanes of the last chunk of 8 (all lanes where d is whole 8s)
        let lanes = d - 8 * chunks.saturating_sub(1);
        // SAFETY: 8 of the 16 values of LANES
        let tail = unsafe { _mm256_loadu_si256(LANES[8 - lanes..].as_ptr().cast()) };
        let mask = |c: usize| {
            if c + 1 == chunks {
                tail
            } else {
                _mm256_set1_epi32(-1)
            }
        };
        scores.clear();
        // the group's scores, then 1 / their sums
        scores.resize(group * n + group, 0.0);
        for h0 in (0..group).step_by(HB2) {
            let hb = (group - h0).min(HB2);
            let q = |g: usize| x.q[(pos * h + first + h0 + g) * d..].as_ptr();
            // scores: 4 keys at a time
            let mut j = 0;
            while j + 4 <= n {
                let mut acc = [[_mm256_setzero_ps(); 4]; HB2];
                for kk in 0..4 {
                    prefetch_row(x.k, base + (j + kk + ROWS_AHEAD) * sj, d);
                }
                for c in 0..chunks {
                    let m = mask(c);
                    let mut ks = [_mm256_setzero_ps(); 4];
                    for (kk, kv) in ks.iter_mut().enumerate() {
                        // SAFETY: rows of d values from checked starts
                        *kv = unsafe {
                            _mm256_maskload_ps(x.k.as_ptr().add(base + (j + kk) * sj + 8 * c), m)
                        };
                    }
                    for (g, a) in acc.iter_mut().enumerate().take(hb) {
                        // SAFETY: q's rows hold d values
                        let qv = unsafe { _mm256_maskload_ps(q(g).add(8 * c), m) };
                        for kk in 0..4 {
                            a[kk] = _mm256_fmadd_ps(qv, ks[kk], a[kk]);
                        }
                    }
                }
                for (g, a) in acc.iter().enumerate().take(hb) {
                    let s = _mm_mul_ps(sum4_256(a), _mm_set1_ps(scale));
                    // SAFETY: scores hold group * n values
                    unsafe { _mm_storeu_ps(scores.as_mut_ptr().add((h0 + g) * n + j), s) };
                }
                j += 4;
            }
            for j in j..n {
                for g in 0..hb {
                    let mut a = _mm256_setzero_ps();
                    for c in 0..chunks {
                        let m = mask(c);
                        // SAFETY: as above
                        a = unsafe {
                            _mm256_fmadd_ps(
                                _mm256_maskload_ps(q(g).add(8 * c), m),
                                _mm256_maskload_ps(x.k.as_ptr().add(base + j * sj + 8 * c), m),
                                a,
                            )
                        };
                    }
                    scores[(h0 + g) * n + j] = hsum8(a) * scale;
                }
            }
        }
        let (scores, inv) = scores.split_at_mut(group * n);
        for (g, f) in inv.iter_mut().enumerate() {
            let s = &mut scores[g * n..(g + 1) * n];
            add_mask(x, bi, first + g, i, s);
            *f = softmax_in_place::<true>(s);
        }
        // the weighted sums of the value rows: 4 chunks of 8 of up to 2
        // heads in registers
        for h0 in (0..group).step_by(HB2) {
            let hb = (group - h0).min(HB2);
            for c0 in (0..chunks).step_by(4) {
                let cs = (chunks - c0).min(4);
                let mut acc = [[_mm256_setzero_ps(); 4]; HB2];
                for j in 0..n {
                    let row = base + j * sj;
                    prefetch_row(x.v, row + ROWS_AHEAD * sj + 8 * c0, 8 * cs);
                    let mut vs = [_mm256_setzero_ps(); 4];
                    for (cc, v) in vs.iter_mut().enumerate().take(cs) {
                        let c = c0 + cc;
                        // SAFETY: as above
                        *v = unsafe { _mm256_maskload_ps(x.v.as_ptr().add(row + 8 * c), mask(c)) };
                    }
                    for (g, a) in acc.iter_mut().enumerate().take(hb) {
                        let p = _mm256_set1_ps(scores[(h0 + g) * n + j]);
                        for (a, &v) in a.iter_mut().zip(&vs).take(cs) {
                            *a = _mm256_fmadd_ps(p, v, *a);
                        }
                    }
                }
                for (g, a) in acc.iter().enumerate().take(hb) {
                    let f = _mm256_set1_ps(inv[h0 + g]);
                    for (cc, &a) in a.iter().enumerate().take(cs) {
                        let c = c0 + cc;
                        // SAFETY: o holds group rows of d values
                        unsafe {
                            _mm256_maskstore_ps(
                                o.as_mut_ptr().add((h0 + g) * d + 8 * c),
                                mask(c),
                                _mm256_mul_ps(a, f),
                            )
                        };
                    }
                }
            }
        }
    }

    /// As `sum4`, for 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum4_256(a: &[__m256; 4]) -> __m128 {
        let a01 = _mm256_add_ps(
            _mm256_unpacklo_ps(a[0], a[1]),
            _mm256_unpackhi_ps(a[0], a[1]),
        );
        let a23 = _mm256_add_ps(
            _mm256_unpacklo_ps(a[2], a[3]),
            _mm256_unpackhi_ps(a[2], a[3]),
        );
        let (a01, a23) = (_mm256_castps_pd(a01), _mm256_castps_pd(a23));
        let s = _mm256_add_ps(
            _mm256_castpd_ps(_mm256_unpacklo_pd(a01, a23)),
            _mm256_castpd_ps(_mm256_unpackhi_pd(a01, a23)),
        );
        _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s))
    }

    /// The sum of the lanes of `a`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum8(a: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// 8 lanes set, then 8 clear: the 8 from `8 - n` on set the first `n`.
    const LANES: [i32; 16] = [-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0];

    /// The sums of the lanes of 4 vectors.
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    fn sum4(a: &[__m512; 4]) -> __m128 {
        let a01 = _mm512_add_ps(
            _mm512_unpacklo_ps(a[0], a[1]),
            _mm512_unpackhi_ps(a[0], a[1]),
        );
        let a23 = _mm512_add_ps(
            _mm512_unpacklo_ps(a[2], a[3]),
            _mm512_unpackhi_ps(a[2], a[3]),
        );
        let (a01, a23) = (_mm512_castps_pd(a01), _mm512_castps_pd(a23));
        let s = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a01, a23)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a01, a23)),
        );
        let t = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps::<1>(s));
        _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t))
    }
}

/// `a · b` in 16 lanes.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ac, at) = a.as_chunks::<16>();
    let (bc, bt) = b.as_chunks::<16>();
    for (x, y) in ac.iter().zip(bc) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = at.iter().zip(bt).map(|(x, y)| x * y).sum();
    fold(acc) + tail
}

/// The largest of `v` (NaN ignored, as `f32::max` does) in 64 lanes: four
/// vectors of 16 compared independently, so that a long row does not wait
/// on one register's chain of comparisons (the largest is the same in any
/// order).
#[inline(always)]
fn row_max(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 64];
    let (c, t) = v.as_chunks::<64>();
    for x in c {
        for l in 0..64 {
            // a comparison, one max instruction a vector: `f32::max`'s NaN
            // rule costs a test and a blend more (a NaN compares false
            // here and is ignored too, the lanes never holding one)
            acc[l] = if x[l] > acc[l] { x[l] } else { acc[l] };
        }
    }
    let m = acc.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    t.iter().fold(m, |a, &b| a.max(b))
}

/// The sum of `v` in 16 lanes.
#[inline(always)]
fn sum(v: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (c, t) = v.as_chunks::<16>();
    for x in c {
        for l in 0..16 {
            acc[l] += x[l];
        }
    }
    fold(acc) + t.iter().sum::<f32>()
}

/// The sum of 16 lanes by halves, which vectorizes (a sum in lane order
/// is a chain of scalar additions).
#[inline(always)]
fn fold(mut acc: [f32; 16]) -> f32 {
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

/// Whether `f32::mul_add` is one instruction wherever the build's target
/// runs. Elsewhere (x86-64 without FMA) it calls libm's software `fmaf`,
/// which costs tens of cycles and keeps loops scalar, so the portable
/// kernels multiply and add instead.
pub(super) const FMA_IN_TARGET: bool = cfg!(any(target_feature = "fma", target_arch = "aarch64"));

/// `a·b + c`, fused when `FUSED` (see [`FMA_IN_TARGET`]).
#[inline(always)]
pub(super) fn madd<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED { a.mul_add(b, c) } else { a * b + c }
}

/// `e^x` within 2 ulp (Cephes' polynomial on x - n ln 2), 0 below -87
/// (where f32 becomes subnormal), for -∞ and for NaN, +∞ above 88.
/// Branch-free and free of libm calls, so that loops over it vectorize;
/// `FUSED` as in [`madd`].
#[inline(always)]
pub(super) fn exp<const FUSED: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts: n * C1 is exact for the n that occur
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // 1.5 · 2^23: adding it rounds a float of magnitude below 2^22 to an
    // integer held in the low bits of the sum's mantissa
    const ROUND: f32 = 12_582_912.0;
    let live = x >= -87.0;
    let xc = x.clamp(-87.0, 88.0);
    // n = round(xc / ln 2) in [-126, 127] by the magic sum, in float and
    // integer operations only: a float-to-int cast saturates and maps NaN
    // to 0 in Rust, which keeps it (and the loop) scalar
    let shifted = xc * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = xc - n * C1 - n * C2;
    let mut p = 1.987_569_1e-4f32;
    p = madd::<FUSED>(p, r, 1.398_199_9e-3);
    p = madd::<FUSED>(p, r, 8.333_452e-3);
    p = madd::<FUSED>(p, r, 4.166_579_6e-2);
    p = madd::<FUSED>(p, r, 1.666_666_5e-1);
    p = madd::<FUSED>(p, r, 0.5);
    let e = madd::<FUSED>(p * r, r, r) + 1.0;
    // 2^n from the sum's low bits (n in [-126, 127] here; garbage for a
    // NaN, which `live` turns into 0)
    let two_n = f32::from_bits(
        shifted
            .to_bits()
            .wrapping_sub(ROUND.to_bits())
            .wrapping_add(127)
            << 23,
    );
    let e = if x > 88.0 { f32::INFINITY } else { e * two_n };
    if live { e } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 definition, as `nn::attention`'s exact path computes it.
    fn reference(x: &Inputs<'_>, scale: f32, causal: bool) -> Vec<f32> {
        let [b, tq, h, d, tk, kvh] = x.dims;
        let mut y = vec![0f32; b * tq * h * d];
        for (row, o) in y.chunks_exact_mut(d).enumerate() {
            let (bi, i, hi) = (row / (tq * h), (row / h) % tq, row % h);
            let kv = hi / (h / kvh);
            let visible = if causal { i + (tk - tq) + 1 } else { tk };
            let [sb, sj, sh] = x.kv_strides;
            let at = |j: usize| bi * sb + j * sj + kv * sh;
            let mut s: Vec<f64> = (0..visible)
                .map(|j| {
                    let dot: f64 = (0..d)
                        .map(|e| f64::from(x.q[row * d + e]) * f64::from(x.k[at(j) + e]))
                        .sum();
                    let m = x.mask.map_or(0.0, |(m, ms)| {
                        m[bi * ms[0] + hi * ms[1] + i * ms[2] + j * ms[3]]
                    });
                    dot * f64::from(scale) + f64::from(m)
                })
                .collect();
            let max = s.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v));
            for v in &mut s {
                *v = if *v == f64::NEG_INFINITY {
                    0.0
                } else {
                    (*v - max).exp()
                };
            }
            let sum: f64 = s.iter().sum();
            for (e, o) in o.iter_mut().enumerate() {
                let a: f64 = (0..visible).map(|j| s[j] * f64::from(x.v[at(j) + e])).sum();
                *o = (a / sum) as f32;
            }
        }
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        // a small deterministic spread of values in [-2, 2)
        (0..n)
            .map(|i| {
                let t = (i as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed * 97);
                (t >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn matches_the_f64_definition() {
        // d past and short of 16 lanes, grouped heads, cached positions
        // before the queries, a mask broadcast over heads with -inf entries
        // (on every path the processor has); 5 heads a KV head (more than
        // the AVX-512 kernel takes at once), 5 chunks of 16 (more than it
        // keeps in registers), a decode step over a long context (split
        // over the spinning pool)
        let cases = [
            (1, 1, 1, 1, 1, 16),
            (1, 5, 5, 9, 3, 64),
            (2, 3, 7, 4, 2, 20),
            (1, 130, 130, 2, 1, 64),
            (1, 2, 40, 6, 6, 7),
            (1, 3, 11, 10, 2, 80),
            (1, 1, 300, 9, 3, 64),
            (1, 1, 200, 10, 2, 80),
            (1, 2, 9, 2, 1, 256),
            // prompts without a causal mask: the matrix products of each
            // (batch row, head)
            (2, 20, 25, 4, 2, 20),
            (1, 16, 16, 3, 3, 7),
            (3, 17, 40, 6, 2, 32),
            // more than one block of queries
            (1, 150, 170, 2, 1, 16),
        ];
        for (isa, &(b, tq, tk, h, kvh, d)) in crate::cpu_isa_available()
            .into_iter()
            .flat_map(|i| cases.iter().map(move |c| (i, c)))
        {
            let q = values(b * tq * h * d, 1);
            let k = values(b * tk * kvh * d, 2);
            let v = values(b * tk * kvh * d, 3);
            let mask: Vec<f32> = (0..b * tq * tk)
                .map(|i| match i % 5 {
                    0 => f32::NEG_INFINITY,
                    1 => -0.5,
                    _ => 0.0,
                })
                .collect();
            let strides = [tq * tk, 0, tk, 1];
            for (causal, masked) in [(true, false), (false, false), (false, true), (true, true)] {
                let dims = [b, tq, h, d, tk, kvh];
                let x = Inputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    kv_strides: Inputs::packed_kv(dims),
                    mask: masked.then_some((&mask[..], &strides[..])),
                    dims,
                };
                let want = reference(&x, 0.3, causal);
                let mut got = vec![0f32; want.len()];
                attention_on(isa, &x, 0.3, causal, &mut got);
                // the same keys and values read in place from a cache of
                // spare positions with k and v side by side: the same numbers
                let cap = tk + 3;
                let st = [cap * 2 * kvh * d, 2 * kvh * d, d];
                let mut cache = vec![f32::NAN; b * st[0]];
                for (bi, j, kv) in (0..b)
                    .flat_map(|bi| (0..tk).flat_map(move |j| (0..kvh).map(move |kv| (bi, j, kv))))
                {
                    let from = ((bi * tk + j) * kvh + kv) * d;
                    let to = bi * st[0] + j * st[1] + kv * st[2];
                    cache[to..to + d].copy_from_slice(&k[from..from + d]);
                    cache[to + kvh * d..to + kvh * d + d].copy_from_slice(&v[from..from + d]);
                }
                let viewed = Inputs {
                    k: &cache,
                    v: &cache[kvh * d..],
                    kv_strides: st,
                    ..x
                };
                let mut in_place = vec![0f32; want.len()];
                attention_on(isa, &viewed, 0.3, causal, &mut in_place);
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    in_place.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{isa:?} {dims:?} read in place"
                );
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let same =
                        (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-5 * w.abs().max(1.0);
                    assert!(
                        same,
                        "{isa:?} {:?} causal {causal} mask {masked} [{i}]: {g} vs {w}",
                        x.dims
                    );
                }
            }
        }
    }

    fn exp_close_to_the_f64_exp<const FUSED: bool>() {
        let exp = exp::<FUSED>;
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 3e-7, "fused {FUSED}: worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1000.0), 0.0);
        assert_eq!(exp(f32::NAN), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        let big = f64::from(exp(88.0));
        assert!((big / 88f64.exp() - 1.0).abs() < 3e-7);
        // negative non-integers and values near the rounding ties
        for x in [-0.4f32, -0.35, -1.0, -3.3, -60.7, -86.9] {
            let want = f64::from(x).exp();
            assert!((f64::from(exp(x)) / want - 1.0).abs() < 3e-7, "exp({x})");
        }
    }

    #[test]
    fn exp_is_close_to_the_f64_exp() {
        exp_close_to_the_f64_exp::<true>();
        exp_close_to_the_f64_exp::<false>();
    }
}
