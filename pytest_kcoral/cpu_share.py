"""CPU threads per process: each process of the session gets a fair share of the host's cores.

torch runs its CPU work (the output comparisons in the pytest process; copies and checks in the
children) on an OpenMP pool as wide as the process's cores, and the pool's threads spin for a while
after each parallel region. Two xdist workers with pools as wide as the machine fight over every
core, and every phase of an item grows (docs/performance.md, "Scaling: the workers' CPU pools
were what grew every phase").

So the cores are divided among the processes that may run at once: the session's xdist workers,
or the host's GPUs when there are more of them (other sessions may be grading on those), and each
of those twice, because a worker's pytest process and its candidate (or trusted) child both hold a
pool whose threads spin (docs/performance.md, "Scaling: a worker holds two pools, so the share
counts both"). A serial run gets the same share as a parallel one, so the two time the same way.
``--kcoral-cpu-threads`` overrides the share.
"""

from __future__ import annotations

import os
from typing import Any

# torch pools per worker that may spin at once: the pytest process's and its current child's
POOLS_PER_WORKER = 2


def threads_per_process(cores: int, processes: int) -> int:
    """``cores`` divided among ``processes`` running at once, at least one thread each."""
    return max(1, cores // max(1, processes))


def session_workers(config: Any) -> int:
    """The number of xdist workers of the session ``config`` belongs to (1 without xdist). Read
    from the worker's config, not the environment: a session started inside an xdist worker (a
    test of this plugin) inherits that worker's variables."""
    workerinput = getattr(config, "workerinput", None)
    return max(1, int(workerinput.get("workercount", 1))) if workerinput else 1


def share(processes: int) -> int:
    """This process's share of the cores it may run on (after ``pinning.reserve``), with
    ``processes`` of the session's workers running at once, each with its child."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return threads_per_process(cores, POOLS_PER_WORKER * processes)


def limit(threads: int) -> None:
    """Size this process's torch CPU pool (intra-op threads) to ``threads``."""
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
