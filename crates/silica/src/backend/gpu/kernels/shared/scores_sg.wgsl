// scores_sg.wgsl — scores.wgsl's scores with KL lanes a key (KL, set by
// the launcher: the head's vec4 chunks rounded up to a power of two, at
// most the subgroup width): lane j of a key's KL takes chunks j, j + KL,
// ..., so that the lanes of a subgroup load whole runs of a few keys'
// rows instead of one row each, and a butterfly of shuffles adds the
// lanes' parts. Each lane has KEY_UNROLL keys' loads in flight. Writes
// the slots of `score` below n only. The key loads are most of the decode
// kernel's time, and whole runs cut it (docs/tuning.md, "Decode attention
// scores").

// chunks a lane takes of each key
override CPL: u32 = (D4 + KL - 1u) / KL;
const KEY_UNROLL: u32 = 8u;

fn key_scores(lid: u32, n: u32, k0: u32, m0: u32, begin: u32, fresh: bool) {
    let kc = lid % KL;
    let grp = lid / KL;
    let groups = THREADS / KL;
    let last = max(n, 1u) - 1u;
    // the same trip count in every thread: the shuffles need whole subgroups
    for (var b0 = 0u; b0 < n; b0 += groups * KEY_UNROLL) {
        var x: array<f32, KEY_UNROLL>;
        for (var u = 0u; u < KEY_UNROLL; u++) {
            // keys past the chunk are clamped to its last one and dropped
            let kr = k0 + (begin + min(b0 + u * groups + grp, last)) * p.sk.y;
            var s = 0.0;
            for (var j = 0u; j < CPL; j++) {
                let c = min(kc + j * KL, D4 - 1u);
                let part = dot(qsh[c], ld4(K, kr + 4u * c * p.sk.w, head_chunk(c), p.sk.w));
                s += select(0.0, part, kc + j * KL < D4);
            }
            x[u] = s;
        }
        for (var u = 0u; u < KEY_UNROLL; u++) {
            var s = x[u];
            // lanes less than KL apart hold the same key (KL <= 32)
            for (var o = 16u; o > 0u; o >>= 1u) {
                let other = subgroupShuffleXor(s, o);
                s += select(0.0, other, o < KL);
            }
            let t = b0 + u * groups + grp;
            if kc == 0u && t < n {
                if STEP && fresh && t == n - 1u {
                    s = fresh_dot();
                }
                score[t] = finish_score(t, n, m0, begin, s);
            }
        }
    }
}
