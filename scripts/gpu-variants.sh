#!/usr/bin/env bash
# One call on the GPU machine: the benchmark of the working tree, then of each patch in a folder applied
# on top of it, on the same machine (so machine-to-machine variance drops out), each compared with the first.
# Usage (device tool): bash scripts/gpu-variants.sh PATCH_DIR   (BENCH_ARGS: extra `replayssm bench` arguments)
# Make the patches here with `git diff main...BRANCH > PATCH_DIR/BRANCH.patch` (PATCH_DIR ignored, carried).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
patches=${1:?a folder of .patch files}
. "$(dirname "$0")/device-setup.sh"
bench() {  # $1: name; results in $OUT/$1.json, the rows' lines in $OUT/$1.log, the whole log in /tmp/bench-$1.log
  rm -rf "/tmp/bench-$1"
  python3 -m replayssm_dsl.runtime.cli bench --out "/tmp/bench-$1" ${BENCH_ARGS:-} > "/tmp/bench-$1.log" 2>&1
  local rc=$?
  grep -E "^[a-z0-9.-]+ +B=" "/tmp/bench-$1.log" | tee "$OUT/$1.log"
  [[ -f "/tmp/bench-$1/results.json" ]] && cp "/tmp/bench-$1/results.json" "$OUT/$1.json"
  if (( rc != 0 )); then tail -20 "/tmp/bench-$1.log"; return 1; fi
}
bench base || { echo "the tree's bench failed: nothing to compare with"; exit 1; }
summary=()
for patch in "$patches"/*.patch; do
  name=$(basename "$patch" .patch)
  if ! patch -p1 --dry-run --quiet < "$patch" > /dev/null; then  # a patch that applies in part would leave the tree dirty
    summary+=("$name: does not apply to the tree")
    continue
  fi
  patch -p1 --quiet < "$patch"
  bench "$name" || summary+=("$name: bench failed (rows it finished, if any, in $name.json)")
  patch -p1 -R --quiet < "$patch" || { echo "$name: could not take the patch back out: stopping"; break; }
  [[ -f "$OUT/$name.json" ]] && summary+=("$(python3 -m replayssm_dsl.runtime.cli compare "$OUT/base.json" "$OUT/$name.json" 2>&1 | sed "s/^| /| $name: /")")
done
echo "==================== new / old per patch (old: base) ===================="
printf '%s\n' "${summary[@]}"
