# Source this on the GPU machine before any bench or GPU test of your own: `source bench/gpu_env.sh`.
# It installs the carried wheels (.whl/: cupti-python without deps, pyelftools) into /tmp/site and
# puts them on PYTHONPATH for this shell, and installs this checkout without touching its deps.
# Without it a GPU is timed by CUDA events, not CUPTI (session 7's first scaling run: the summary's
# TIMER FALLBACK line says so).
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
export PYTHONUNBUFFERED=1
