# Sourced by the device scripts (gpu-check.sh, gpu-variants.sh): install the project (editable, no
# network) and the carried wheels of .whl/, then name the GPU. Needs OUT set; exits on a failed install.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1
  export PYTHONPATH=/tmp/site
fi
nvidia-smi -L
