#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (cargo fuzz, libFuzzer) for a fixed time
# and reports each target's executions and findings.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Defaults: 60 seconds, all targets (gguf, safetensors, gguf_tokenizer,
# config_json). Needs cargo-fuzz (`cargo install cargo-fuzz`); on a stable
# toolchain RUSTC_BOOTSTRAP=1 (set here) lets it pass its nightly flags.
#
# The targets are built optimized with debug assertions and overflow checks
# (-a) and without a sanitizer (-s none): the code under test is safe Rust,
# so panics, overflows, aborts, hangs (-timeout) and memory blow-ups
# (-rss_limit_mb, -malloc_limit_mb) are what there is to find.
#
# Seeds come from fuzz/make_seeds.py (into fuzz/seeds/, regenerated each
# run); the corpus each run grows is kept in fuzz/corpus/<target>; inputs
# that fail are written to fuzz/artifacts/<target>/ (by cargo fuzz). The script exits 1 when
# any target found something (crash, panic, timeout or out-of-memory).
set -uo pipefail

secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(gguf safetensors gguf_tokenizer config_json)
fi

cd "$(dirname "$0")/.."
root=$(pwd)
export RUSTC_BOOTSTRAP=1
flags=(-a -s none)
rss_mb=${FUZZ_RSS_MB:-2048}
timeout_s=${FUZZ_TIMEOUT_S:-10}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: cargo-fuzz is not installed (cargo install cargo-fuzz)" >&2
    exit 2
fi
python3 fuzz/make_seeds.py fuzz/seeds || exit 2
(cd fuzz && cargo fuzz build "${flags[@]}") || exit 2

logs=fuzz/logs
mkdir -p "$logs"
found=0
summary=()
for t in "${targets[@]}"; do
    dict=fuzz/dict/$t.dict
    [ "$t" = gguf_tokenizer ] && dict=fuzz/dict/gguf.dict
    corpus=fuzz/corpus/$t
    artifacts=fuzz/artifacts/$t
    mkdir -p "$corpus" "$artifacts"
    log=$logs/$t.log
    echo "== $t: ${secs}s"
    start=$(date +%s)
    (cd fuzz && cargo fuzz run "${flags[@]}" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" \
        -rss_limit_mb="$rss_mb" -malloc_limit_mb="$rss_mb" \
        -timeout="$timeout_s" \
        -dict="$root/$dict" \
        -print_final_stats=1) >"$log" 2>&1
    rc=$?
    took=$(($(date +%s) - start))
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    execs=${execs:-0}
    rate=$((execs / (took > 0 ? took : 1)))
    files=$(find "$corpus" -type f | wc -l)
    new=$(find "$artifacts" -type f -newermt "@$start" | wc -l)
    status=ok
    if [ $rc -ne 0 ] || [ "$new" -gt 0 ]; then
        status="FOUND (exit $rc)"
        found=1
        grep -E '^==[0-9]+== ERROR|panicked at|^SUMMARY|deadly signal|out-of-memory|timeout' "$log" | head -5
        find "$artifacts" -type f -newermt "@$start" | sed 's/^/    input: /'
    fi
    line=$(printf '%-15s %12s execs %6ss %9s exec/s  corpus %6s  %s' \
        "$t" "$execs" "$took" "$rate" "$files" "$status")
    echo "$line"
    summary+=("$line")
done

echo
echo "== summary (log per target in $logs/)"
printf '%s\n' "${summary[@]}"
exit $found
