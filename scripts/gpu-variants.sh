#!/usr/bin/env bash
# One call on the GPU machine: the benchmark of the working tree, then of each patch in a folder applied
# on top of it, on the same machine (so machine-to-machine variance drops out), each compared with the first.
# Usage (device tool): bash scripts/gpu-variants.sh PATCH_DIR   (BENCH_ARGS: extra `replayssm bench` arguments)
# Make the patches here with `git diff main...BRANCH > PATCH_DIR/BRANCH.patch` (PATCH_DIR ignored, carried).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
patches=${1:?a folder of .patch files}
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
  export PYTHONPATH=/tmp/site
fi
nvidia-smi -L
bench() {  # $1: name; results in $OUT/$1.json, the run's log in /tmp/bench-$1
  python3 -m replayssm_dsl.runtime.cli bench --out "/tmp/bench-$1" ${BENCH_ARGS:-} 2>&1 | grep -E "^[a-z0-9.-]+ +B=" | tee "$OUT/$1.log"
  cp "/tmp/bench-$1/results.json" "$OUT/$1.json"
}
bench base
summary=()
for patch in "$patches"/*.patch; do
  name=$(basename "$patch" .patch)
  patch -p1 --quiet < "$patch" || { summary+=("$name: patch does not apply"); continue; }
  bench "$name"
  patch -p1 -R --quiet < "$patch"
  summary+=("$(python3 -m replayssm_dsl.runtime.cli compare "$OUT/base.json" "$OUT/$name.json" | sed "s/^| /| $name: /")")
done
echo "==================== new / old per patch (old: base) ===================="
printf '%s\n' "${summary[@]}"
