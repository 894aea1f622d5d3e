#!/usr/bin/env bash
# One call on the GPU machine: install, GPU tests, sanitizers, benchmarks; a short table last.
# Usage (device tool): bash scripts/gpu-check.sh [tests] [sanitize] [examples] [hf] [bench] [headline] [profile] [stalls] | all
# (BENCH_ARGS: extra `replayssm bench` arguments; BENCH_BASELINE: a results.json to compare against;
# TEST_MARKS: the tests' markers, default "gpu or fla"; "gpu or fla or nvrtc" adds the sm_90 compile checks
# through this machine's NVRTC; TEST_ARGS: what pytest collects, default "tests", e.g. "tests/test_gpu_kernels.py"
# or "tests --ignore=tests/test_gpu_kernels.py" to split the suite over two calls on a fresh machine, or
# "tests -n 4" with the pytest-xdist and execnet wheels in .whl/: four test processes share the GPU)
# (default: all, which leaves out headline, profile and stalls; after bench, both use the launch shapes bench tuned)
# headline: the issue's table in one call: bench at B = 256 (every kernel), then at B = 1 (the steps, FLA and
# the floors), both cut so that they end HEADLINE_S seconds into the script (default 540, install included),
# joined by `replayssm report` into $OUT's results.* (a run cut short keeps its rows); with BENCH_BASELINE,
# compare.md too (the second run finds the first one's cubins in CuPy's cache)
# At most 8 files come back from $OUT: install.log, gpu-tests.log, sanitize.log, examples.log, hf.log and
# bench's results.json, results.md, speedup.png (compare.md with BENCH_BASELINE, so leave out a part then).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
what=" ${*:-all} "
wants() { [[ $what == *" all "* || $what == *" $1 "* ]]; }
. "$(dirname "$0")/device-setup.sh"
summary=()
# run_logged LOG LABEL CMD...: run CMD, append its output to $OUT/LOG under "== LABEL: rc=N"; leaves rc
# and the output in /tmp/part.log (one log per part: at most 8 files come back from $OUT)
run_logged() {
  local log=$1 label=$2; shift 2
  "$@" > /tmp/part.log 2>&1
  rc=$?
  { echo "== $label: rc=$rc"; cat /tmp/part.log; } >> "$OUT/$log"
}
if wants tests; then
  python3 -m pytest ${TEST_ARGS:-tests} -q -p no:cacheprovider -m "${TEST_MARKS:-gpu or fla}" -rs --durations=8 2>&1 | tee "$OUT/gpu-tests.log"
  summary+=("${TEST_MARKS:-gpu or fla} tests: $(tail -1 "$OUT/gpu-tests.log")")
fi
if wants sanitize; then
  : > "$OUT/sanitize.log"
  for tool in memcheck racecheck; do
    run_logged sanitize.log "compute-sanitizer --tool $tool" \
      compute-sanitizer --tool $tool --error-exitcode 3 python3 scripts/sanitize_small.py
    summary+=("compute-sanitizer $tool: rc=$rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/part.log | tail -1)")
  done
fi
if wants examples; then
  : > "$OUT/examples.log"
  for ex in examples/*.py; do
    run_logged examples.log "$ex --backend cuda" python3 "$ex" --backend cuda
    summary+=("$(basename "$ex"): rc=$rc $(tail -1 /tmp/part.log)")
  done
  run_logged examples.log "replayssm check gdn --backend cuda" \
    python3 -m replayssm_dsl.runtime.cli check gdn --backend cuda --preset qwen3.5-4b --steps 100
  summary+=("replayssm check gdn --backend cuda: rc=$rc $(tail -1 /tmp/part.log)")
fi
if wants hf; then
  : > "$OUT/hf.log"
  for ex in mamba2 qwen3_next kimi_linear; do
    run_logged hf.log "examples/hf/$ex.py --device cuda" python3 examples/hf/$ex.py --device cuda
    summary+=("examples/hf/$ex.py --device cuda: rc=$rc $(tail -1 /tmp/part.log)")
  done
fi
if wants bench; then  # the table and the comparison go to stdout; results.md holds the table too
  python3 -m replayssm_dsl.runtime.cli bench --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee /tmp/bench.log
  if [[ -n ${BENCH_BASELINE:-} ]]; then  # a committed results.json: new / old per kernel, copy column = machine variance
    python3 -m replayssm_dsl.runtime.cli compare "$BENCH_BASELINE" "$OUT/results.json" 2>&1 | tee "$OUT/compare.md"
  fi
fi
if [[ $what == *" headline "* ]]; then  # both benches end by HEADLINE_S seconds into this script (default 540)
  budget=${HEADLINE_S:-540}
  [[ $budget =~ ^[0-9]+$ ]] || { echo "HEADLINE_S: expected whole seconds, got '$budget'"; exit 2; }
  rm -rf /tmp/b256 /tmp/b1  # a warm machine keeps an earlier call's results: never join those
  : > "$OUT/headline.log"
  left=$((budget - SECONDS - 60))  # (a minute kept for B = 1)
  if (( left > 30 )); then
    timeout -k 10 $left python3 -m replayssm_dsl.runtime.cli bench --batches 256 --out /tmp/b256 2>&1 | tee -a "$OUT/headline.log"
    rc=${PIPESTATUS[0]}
    summary+=("bench B=256: rc=$rc, $(grep -c '^[a-z].* B=256 ' "$OUT/headline.log") presets by ${SECONDS} s; $(grep -m1 '^compiled' "$OUT/headline.log")")
  fi
  left=$((budget - SECONDS))
  if (( left > 30 )); then
    timeout -k 10 $left python3 -m replayssm_dsl.runtime.cli bench --batches 1 --kernels replay,conventional,fla,floors \
      --out /tmp/b1 2>&1 | tee -a "$OUT/headline.log"
    rc=${PIPESTATUS[0]}
    summary+=("bench B=1: rc=$rc, $(grep -c '^[a-z].* B=1 ' "$OUT/headline.log") presets by ${SECONDS} s")
  fi
  runs=(); for run in /tmp/b1/results.json /tmp/b256/results.json; do [[ -s $run ]] && runs+=("$run"); done
  if (( ${#runs[@]} )); then
    python3 -m replayssm_dsl.runtime.cli report --out "$OUT" "${runs[@]}" 2>&1 | tee -a "$OUT/headline.log"
    if [[ -n ${BENCH_BASELINE:-} ]]; then
      python3 -m replayssm_dsl.runtime.cli compare "$BENCH_BASELINE" "$OUT/results.json" 2>&1 | tee "$OUT/compare.md"
    fi
  else
    summary+=("headline: no bench wrote a row (see headline.log)")
  fi
fi
# Nsight Compute on the 7th launch of one kernel of scripts/profile_step.py (PROFILE_ARGS: --preset, --batch;
# PROFILE_KERNELS, STALL_KERNELS: which kernels)
ncu_one() { local kernel=$1; shift; ncu --clock-control none --kernel-name "$kernel" --launch-skip 6 --launch-count 1 "$@" \
  python3 scripts/profile_step.py ${PROFILE_ARGS:-}; }
if [[ $what == *" profile "* ]]; then  # where a kernel's time goes
  for kernel in ${PROFILE_KERNELS:-replay_step conventional_step flush verify}; do
    ncu_one "$kernel" --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section SchedulerStats --section InstructionStats > "$OUT/profile-$kernel.log" 2>&1
    rc=$?
    summary+=("ncu $kernel: rc=$rc, see profile-$kernel.log: $(grep -E ' Duration |Memory Throughput' "$OUT/profile-$kernel.log" | head -2 | tr -s ' ' | tr '\n' ';')")
  done
fi
if [[ $what == *" stalls "* ]]; then  # where each kernel's warps wait, per SASS instruction (Nsight Compute's stall sampling)
  mkdir -p /tmp/stalls  # the reports stay on the machine (large, and few files come back): CSV and summary go to $OUT
  for kernel in ${STALL_KERNELS:-replay_step conventional_step verify}; do
    ncu_one "$kernel" --section WarpStateStats --section SourceCounters -f -o "/tmp/stalls/$kernel" > "/tmp/stalls/$kernel.log" 2>&1
    rc=$?
    ncu --import "/tmp/stalls/$kernel.ncu-rep" --page source --csv --print-source sass > "$OUT/stalls-$kernel-sass.csv" 2>&1
    python3 scripts/stall_summary.py "$OUT/stalls-$kernel-sass.csv" > "$OUT/stalls-$kernel.txt" 2>&1
    summary+=("ncu stalls $kernel: rc=$rc, stalls-$kernel.txt: $(sed -n 2p "$OUT/stalls-$kernel.txt")")
  done
fi
echo "==================== summary ===================="
printf '%s\n' "${summary[@]}"
