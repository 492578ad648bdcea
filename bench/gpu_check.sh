#!/usr/bin/env bash
# The GPU checks a session owes after GPU-facing changes, each bounded in time. One device call
# allows 10 minutes, so pick the parts that fit (their time on an H200 beside each):
#   bash bench/gpu_check.sh "$OUT" tests           (carry .whl: cupti-python and pyelftools wheels)
#   bash bench/gpu_check.sh "$OUT" suites attacks  (the next call, while the machine is still warm)
# Parts: tests (GPU tests but the suites', ~4 min on 2026-12-03), suites (KernelBench and GPU MODE
# on the GPU, ~3.5 min), attacks (GPU attacks, ~2.3 min), probe (where a child's timing rounds
# lose their calls, ~1 min), turn (a fed call's turn part by part, old tree against new, ~1.5 min), feed (the trusted feed over CUDA IPC and its cost per call, ~1 min),
# throughput (old tree against new, ~2 min), kernelbench (a call of its
# own), noise (process noise, ~1.5 min), self (self-speedup of every bundled case, ~3 min with three pairs of processes
# for host-set items; five since session 16, not yet timed at this budget), events (the events' own
# cost, ~10 s), scaling (the seen shapes of every bundled case with 1, 1 again, 2 and 4 workers;
# two GPUs; ~9 min: a call of its own), drift (the short-kernel cases with 1 and 2 workers at the
# default budget, ~2 min).
# More parts: precision_off (every bundled item at --kcoral-precision off, its JSON for
# bench/replay_stopping.py, ~3 min), aa (the tiny kernels A/A: two baseline children, ~1 min).
# pytest gets SIGINT at its time limit, so it still prints which tests failed and why.
# At most 8 files come back from a device call: past that, everything in the folder is packed
# into one gpu_check.tgz at the end.
# No part named: tests (one call's worth; attacks is the next call). Logs and JSON artifacts land in
# the given folder.
set -uo pipefail
out=${1:-/tmp/kcoral-gpu-check}
shift || true
parts=${*:-tests}
mkdir -p "$out"
# shellcheck source=bench/gpu_env.sh
source "$(dirname "$0")/gpu_env.sh"  # for this script only: a later command of the same device call sources it itself
nvidia-smi -L | tee "$out/machine.log"
{   # what the timing depends on besides the GPUs: SMT layout, the timing cores, transparent huge pages
    lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))"
    python3 -c "from pytest_kcoral.timing import pinning; import os; cores = pinning.timing_cores(os.sched_getaffinity(0)); print('timing cores of GPU 0, 1:', cores[:2], 'siblings:', [sorted(pinning.siblings(c)) for c in cores[:2]])"
    echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
} 2>&1 | tee -a "$out/machine.log"

pytest_summary() {  # what failed, the counts, the slowest tests, and whether the time limit cut the run
    grep -E "^(FAILED|ERROR)|passed|failed|KeyboardInterrupt|^[0-9.]+s call" "$1" | tail -n 16
}

for part in $parts; do
    case $part in
    tests)  # timing and pipeline on a GPU
        timeout -s INT -k 20 400 python3 -m pytest tests/gpu -q -p no:cacheprovider -rs --tb=short --durations=8 \
            --deselect tests/gpu/test_suites_gpu.py > "$out/gpu_tests.log" 2>&1
        pytest_summary "$out/gpu_tests.log" ;;
    suites)  # KernelBench and GPU MODE folders, torch.compile candidates, on a GPU
        timeout -s INT -k 20 400 python3 -m pytest tests/gpu/test_suites_gpu.py -q -p no:cacheprovider -rs --tb=short \
            --durations=8 > "$out/gpu_suites.log" 2>&1
        pytest_summary "$out/gpu_suites.log" ;;
    attacks)  # the GPU-only attacks (and the tamper check on CUDA)
        timeout -s INT -k 20 400 python3 -m pytest tests/adversarial/test_attacks_gpu.py -q -p no:cacheprovider -rs --tb=short \
            --durations=8 > "$out/gpu_attacks.log" 2>&1
        pytest_summary "$out/gpu_attacks.log" ;;
    feed)   # the trusted feed over CUDA IPC: its test, and what a fed call costs (~1 min)
        timeout 120 python3 -m pytest tests/test_feed.py -q -p no:cacheprovider -rs --tb=short > "$out/feed_test.log" 2>&1
        pytest_summary "$out/feed_test.log"
        timeout 120 python3 bench/feed_cost.py --device cuda:0 --calls 2000 > "$out/feed_cost.log" 2>&1
        cat "$out/feed_cost.log" ;;
    turn)   # a fed call's turn, part by part: the flusher and the wake-ups after another process used the GPU,
            # the feed's round trip and the tamper check, $OLD (default .basetree) against this checkout (~1.5 min)
        old=${OLD:-.basetree}
        timeout 200 python3 bench/cross_process_cost.py --calls 3000 > "$out/cross_process.log" 2>&1
        cat "$out/cross_process.log"
        for tree in "$old" .; do
            timeout 100 python3 bench/feed_cost.py --device cuda:0 --calls 3000 --n 4096 --tree "$tree" 2>&1 | tail -n 1
            timeout 60 python3 bench/tamper_cost.py --tree "$tree" 2>&1 | tail -n 1
        done ;;
    probe)  # timing rounds in a plain process and in a grading child, by variant (~1 min)
        timeout 150 python3 bench/round_probe.py > "$out/round_probe.log" 2>&1
        cat "$out/round_probe.log" ;;
    noise)  # the same kernels in fresh processes, twice each (issue 7)
        timeout 100 python3 bench/process_noise.py --processes 4 > "$out/process_noise.log" 2>&1
        cat "$out/process_noise.log" ;;
    self)   # self-speedup noise floor (issue 7)
        timeout 300 python3 bench/self_speedup.py --budget 0.3 --out /tmp/kcoral-self > "$out/self_speedup.log" 2>&1
        head -n 5 "$out/self_speedup.log"
        cp /tmp/kcoral-self/self_speedup.json "$out/" 2>/dev/null ;;
    throughput)  # per-item cost, the tiny-kernel items, .oldtree's code against this checkout's, in turns (~2 min;
                 # carry .oldtree: git archive OLD pytest_kcoral | tar -x -C .oldtree)
        k='self and (vector_add or kcoral_relu)'
        # bench/round_gap_plugin.py: where each round's time goes, seen from the session (in each log)
        PYTHONPATH="$PWD/bench${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 bench/throughput.py --out /tmp/kcoral-throughput \
            --config "old@.oldtree=-k \"$k\" -p round_gap_plugin" --config "new=-k \"$k\" -p round_gap_plugin" > "$out/throughput.log" 2>&1
        cat "$out/throughput.log"
        grep -H "round gap" /tmp/kcoral-throughput/*.log ;;
    kernelbench)  # KernelBench level-1 problems at their own sizes against a KernelBench-style eval loop (issue 28)
        timeout 560 python3 bench/kernelbench_eval.py --out /tmp/kcoral-kb > "$out/kernelbench.log" 2>&1
        cat "$out/kernelbench.log" ;;
    events)  # what events read against CUPTI, and the events' own cost (issue 7)
        timeout 60 python3 bench/events_cost.py > "$out/events_cost.log" 2>&1
        cat "$out/events_cost.log" ;;
    scaling)  # items/s, speedup drift and lease overlaps over workers (issue 4; needs two GPUs)
        timeout 560 python3 bench/scaling.py --workers 1,1,2,4 --budget 0.1 --out /tmp/kcoral-scaling \
            -- cases -m seen > "$out/scaling.log" 2>&1
        cat "$out/scaling.log"
        tar czf "$out/scaling_json.tgz" -C /tmp/kcoral-scaling . 2>/dev/null ;;
    drift)  # do the short kernels that move between runs at the bench's 0.1 s budget hold still at the
            # default 1.0 s? (issue 4's drift; session 8: every unmarked mover was a 1-4 us kernel; ~2 min)
        timeout 300 python3 bench/scaling.py --workers 1,2 --budget 1.0 --out /tmp/kcoral-drift \
            -- cases -m seen -k "vector_add or kcoral_relu or layer_norm" > "$out/drift.log" 2>&1
        cat "$out/drift.log"
        python3 bench/compare_runs.py /tmp/kcoral-drift/scaling_0_n1.json /tmp/kcoral-drift/scaling_1_n2.json \
            | tee "$out/drift_compare.log" ;;
    precision_off)  # every bundled item with all of its rounds, for bench/replay_stopping.py (issue 28)
        timeout -s INT 300 python3 bench/throughput.py --out /tmp/kcoral-precision-off --config 'off=--kcoral-precision off' \
            > "$out/precision_off.log" 2>&1
        cat "$out/precision_off.log"
        cp /tmp/kcoral-precision-off/off-0.json "$out/precision_off.json" 2>/dev/null ;;
    aa)     # do two baseline children read the tiny kernels' one-tick offsets too? (issue 28)
        timeout -s INT 120 python3 bench/self_speedup.py --aa --out /tmp/kcoral-aa -- -k "self and (vector_add or kcoral_relu)" \
            > "$out/aa.log" 2>&1
        head -n 30 "$out/aa.log" ;;
    *) echo "unknown part: $part (tests, suites, attacks, turn, probe, throughput, kernelbench, noise, self, events, scaling, drift, precision_off, aa)" >&2 ;;
    esac
done
if [ "$(find "$out" -type f | wc -l)" -gt 8 ]; then
    tar czf /tmp/kcoral-gpu-check.tgz -C "$out" . && find "$out" -type f -delete && mv /tmp/kcoral-gpu-check.tgz "$out/gpu_check.tgz"
fi
