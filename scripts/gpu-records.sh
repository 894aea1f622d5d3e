#!/usr/bin/env bash
# One call on the GPU machine: KDA's records with bf16 tokens, float32 against raw keys against raw keys
# and decays: the bf16 GPU tests, then `replayssm bench` for kimi-linear at B = 1 and 256 per setting
# (each results.json comes back as $OUT/records-<setting>.json).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. "$(dirname "$0")/device-setup.sh"
python3 -m pytest tests/test_bf16_tokens.py -q -p no:cacheprovider -m "gpu or nvrtc" 2>&1 | tail -4
for setting in float32 bfloat16:key bfloat16:key,decay; do
  dtype=${setting%%:*}; fields=${setting#*:}; [[ $fields == "$setting" ]] && fields=key,decay
  python3 -m replayssm_dsl.runtime.cli bench --out /tmp/bench-$$ --presets ${PRESETS:-kimi-linear} --batches ${BATCHES:-1,256} \
    --token-dtype bfloat16 --record-dtype "$dtype" --raw-record-fields "$fields" \
    --kernels replay,conventional,verify,fla,floors 2>&1 | tail -6
  cp /tmp/bench-$$/results.json "$OUT/records-${dtype}-${fields/,/-}.json"
done
