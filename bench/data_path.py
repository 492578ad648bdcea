"""The parent's data path for large tensors, on this machine's CPU: receiving over a child's pipe,
comparing a passing output, the weak-reference test.

``python bench/data_path.py`` times the installed package; ``--package-root DIR`` times the
``pytest_kcoral`` found in DIR instead (a checkout of another commit), so two commits can be run
side by side. Medians of ``--repeats`` (default 5).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time


def _sender(conn, n: int, repeats: int) -> None:
    import torch

    from pytest_kcoral import protocol

    x = torch.randn(n)
    for _ in range(repeats):
        protocol.send(conn, {"ok": True}, {"x": x})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package-root", default=None, help="a directory holding the pytest_kcoral to time")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.package_root:
        sys.path.insert(0, args.package_root)
    import torch

    from pytest_kcoral import correctness, protocol

    n = 32 << 20  # 128 MiB of fp32
    a, b = mp.Pipe()
    sender = mp.get_context("fork").Process(target=_sender, args=(a, n, args.repeats))
    sender.start()
    recv_s = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        protocol.recv(b)
        recv_s.append(time.perf_counter() - started)
    sender.join()

    ref = torch.randn(1 << 24)
    out = ref + 1e-6 * torch.randn(1 << 24)
    tol = correctness.Tolerance(None, None)
    compare_s, weak_s = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        assert correctness.compare_outputs((out,), (ref,), tol) == []
        compare_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert not correctness.is_weak_reference((ref,), tol)
        weak_s.append(time.perf_counter() - started)
    print(f"{correctness.__file__}: receive 128 MiB {statistics.median(recv_s):.3f} s | "
          f"passing comparison of 2^24 fp32 {statistics.median(compare_s):.3f} s | "
          f"weak-reference test of 2^24 {statistics.median(weak_s):.3f} s")


if __name__ == "__main__":
    main()
