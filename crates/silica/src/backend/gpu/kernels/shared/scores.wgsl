// scores.wgsl — decode_attention.wgsl's scores of a chunk's keys: thread t
// takes the whole dot products of keys t and t + 128 with the query, and
// writes every slot of `score` below MAX_CHUNK. The launcher substitutes
// scores_sg.wgsl where the adapter's subgroups have one width (see
// `kernel_source`).

fn key_scores(lid: u32, n: u32, k0: u32, m0: u32, begin: u32, fresh: bool) {
    for (var r = 0u; r < MAX_CHUNK / THREADS; r++) {
        let t = lid + r * THREADS;
        let kr = k0 + (begin + min(t, max(n, 1u) - 1u)) * p.sk.y;
        var x = 0.0;
        if STEP && fresh && t == n - 1u {
            x = fresh_dot();
        } else {
            for (var c = 0u; c < D4; c++) {
                x += dot(qsh[c], ld4(K, kr + 4u * c * p.sk.w, head_chunk(c), p.sk.w));
            }
        }
        score[t] = finish_score(t, n, m0, begin, x);
    }
}
