"""What a fed call's host-side steps cost when another process used the GPU just before, as the
trusted child does before every timed call (``child_feeder``): the L2 flusher's parts, and the
answer's wake-up, blocking or spinning.

A GPU profile of the grader read 207 us of host time in the flusher per fed call, where
``bench/flush_cost.py`` (one process) reads 24 us. Two processes here take turns as the trusted
child and a fed child do: T writes a small tensor and synchronizes, then answers; F times each part.

    python3 bench/cross_process_cost.py [--calls 3000]    (a GPU machine with cuda-bindings)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import statistics
import time


def _recv(sock: socket.socket, spin: bool) -> bytes:
    if not spin:
        return sock.recv(64)
    while True:
        try:
            return sock.recv(64, socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass


def _trusted(sock: socket.socket, spin: bool, gpu_work: bool) -> None:
    import torch

    x = torch.empty(4096, device="cuda")
    while (msg := _recv(sock, spin)) and msg != b"q":
        if gpu_work:
            x.normal_()
            torch.cuda.synchronize()
        sock.sendall(b"r")


def _fed(sock: socket.socket, spin: bool, calls: int, out: mp.Queue) -> None:
    import torch

    from pytest_kcoral.timing.l2 import L2Flusher

    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        from cuda import cudart
    limit = cudart.cudaLimit.cudaLimitPersistingL2CacheSize
    flusher = L2Flusher(torch, torch.device("cuda"))
    x = torch.randn(4096, device="cuda")
    parts = {"trip": [], "get limit": [], "set limit 0": [], "reset persisting": [], "read 2 x L2": [], "sync": [], "call": []}
    for _ in range(calls):
        t0 = time.perf_counter()
        sock.sendall(b"c")
        _recv(sock, spin)
        t1 = time.perf_counter()
        cudart.cudaDeviceGetLimit(limit)
        t2 = time.perf_counter()
        cudart.cudaDeviceSetLimit(limit, 0)
        t3 = time.perf_counter()
        cudart.cudaCtxResetPersistingL2Cache()
        t4 = time.perf_counter()
        flusher._sum(flusher._buffer, 0, out=flusher._out)
        t5 = time.perf_counter()
        torch.cuda.synchronize()
        t6 = time.perf_counter()
        torch.relu(x)
        torch.cuda.synchronize()
        t7 = time.perf_counter()
        for key, a, b in zip(parts, (t0, t1, t2, t3, t4, t5, t6), (t1, t2, t3, t4, t5, t6, t7)):
            parts[key].append((b - a) * 1e6)
    sock.sendall(b"q")
    out.put({k: statistics.median(v[100:]) for k, v in parts.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    print("| T's GPU work | wait | " + " | ".join(["trip", "get limit", "set limit 0", "reset persisting", "read 2 x L2", "sync", "call"]) + " |")
    print("|---" * 9 + "|")
    for gpu_work in (False, True):
        for spin in (False, True):
            a, b = socket.socketpair()
            queue: mp.Queue = ctx.Queue()
            procs = [ctx.Process(target=_trusted, args=(a, spin, gpu_work)), ctx.Process(target=_fed, args=(b, spin, args.calls, queue))]
            for p in procs:
                p.start()
            found = queue.get(timeout=300)
            for p in procs:
                p.join(30)
            print(f"| {'write + sync' if gpu_work else 'none'} | {'spin' if spin else 'block'} | "
                  + " | ".join(f"{v:.1f}" for v in found.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
