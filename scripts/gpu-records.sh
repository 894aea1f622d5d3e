#!/usr/bin/env bash
# One call on the GPU machine: KDA's records with bf16 tokens, float32 against raw keys against raw keys
# and decays: the bf16 GPU tests, then `replayssm bench` for kimi-linear at B = 1 and 256 per setting
# (PRESETS, BATCHES override), each setting's results.json back as $OUT/records-float32.json,
# records-bfloat16-key.json and records-bfloat16-key-decay.json; a bench that fails leaves no file.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. "$(dirname "$0")/device-setup.sh"
python3 -m pytest tests/test_bf16_tokens.py -q -p no:cacheprovider -m "gpu or nvrtc" 2>&1 | tail -4
for setting in float32 bfloat16:key bfloat16:key,decay; do
  dtype=${setting%%:*}; fields=${setting#*:}
  if [[ $dtype == float32 ]]; then fields=key,decay; name=float32; else name=$dtype-${fields/,/-}; fi
  dir=/tmp/bench-records-$name; rm -rf "$dir"
  python3 -m replayssm_dsl.runtime.cli bench --out "$dir" --presets "${PRESETS:-kimi-linear}" --batches "${BATCHES:-1,256}" \
    --token-dtype bfloat16 --record-dtype "$dtype" --raw-record-fields "$fields" \
    --kernels replay,conventional,verify,fla,floors > "$dir.log" 2>&1
  rc=$?
  tail -6 "$dir.log"
  if [[ $rc == 0 ]]; then cp "$dir/results.json" "$OUT/records-$name.json"; else echo "bench $setting failed: rc=$rc"; fi
done
