#!/usr/bin/env bash
# The GPU checks a session owes after GPU-facing changes, in priority order, each bounded in time,
# so they fit one device call (about 9 minutes). On the device machine, from the repo root:
#   bash bench/gpu_check.sh "$OUT"        (carry .whl: cupti-python and pyelftools wheels)
# Logs land in the given folder (at most 8 files come back from a device call).
set -uo pipefail
out=${1:-/tmp/kcoral-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
nvidia-smi -L | tee "$out/machine.log"

# 1. GPU tests: timing, the pipeline on a GPU, the GPU-only attacks (and the tamper check on CUDA)
timeout 240 python3 -m pytest tests/gpu tests/adversarial/test_attacks_gpu.py -q -p no:cacheprovider -rs \
    > "$out/gpu_tests.log" 2>&1
tail -n 3 "$out/gpu_tests.log"

# 2. scaling over workers on a subset that fits (issue 4): items/s, speedup drift, lease overlaps
timeout 200 python3 bench/scaling.py --workers 1,2 --budget 0.1 --out /tmp/kcoral-scaling \
    cases/vector_add cases/row_softmax > "$out/scaling.log" 2>&1
tail -n 6 "$out/scaling.log"

# 3. self-speedup noise floor (issue 7)
timeout 150 python3 bench/self_speedup.py --budget 0.3 --out /tmp/kcoral-self > "$out/self_speedup.log" 2>&1
head -n 5 "$out/self_speedup.log"
