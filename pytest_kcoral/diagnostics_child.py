"""The process Nsight Compute or compute-sanitizer inspects: ``python -m pytest_kcoral.diagnostics_child JOB``.

It loads the case and the candidate the way a candidate child does, runs the candidate on the
saved correctness inputs (``inputs.pt`` beside the job file, all sets or the first ``calls``), and
synchronizes after each call, so every kernel has run before the tool reports. Run by
``diagnostics.py`` in a private directory; nothing it prints is trusted as a result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    job_path = Path(argv[1])
    job = json.loads(job_path.read_text())
    sys.path[:] = [p for p in sys.path if p not in ("", ".", str(job_path.parent))]

    import torch

    from pytest_kcoral.case_files import keep_private_bytecode_in
    from pytest_kcoral.case_runtime import CandidateRuntime, CaseRuntime

    # the case's bytecode goes with the run's private directory, also when the tool's time runs
    # out and this process is killed before its own cleanup
    keep_private_bytecode_in(job_path.parent / "pycache")

    device = job["case"]["device"]
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    case = CaseRuntime(job["case"])
    inputs = torch.load(job_path.parent / "inputs.pt", weights_only=True)
    shape = job["shape"]
    candidate = CandidateRuntime(job["candidate"], case, shape)
    calls = inputs[: job.get("calls") or len(inputs)]
    for cpu_args in calls:
        args = tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in cpu_args)
        candidate.bind(shape, args)()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    print(f"kcoral diagnostics: {len(calls)} call(s) of {job['candidate']} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
