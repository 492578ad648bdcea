"""Which executor grades the session's items: children on this host (``pipeline``), or programs
on a KCoral service under ``--kcoral-url`` (``remote``). Built on first use, so a collection-only
run starts nothing."""

from __future__ import annotations

import pytest

from pytest_kcoral import cpu_share, isolation
from pytest_kcoral.context import Executor
from pytest_kcoral.devices import host_timing_slots
from pytest_kcoral.lease_plugin import get_devices, lease_factory
from pytest_kcoral.pipeline import LocalExecutor
from pytest_kcoral.remote import RemoteExecutor
from pytest_kcoral.sandbox import Sandbox
from pytest_kcoral.stash import executor_key, get_settings
from pytest_kcoral.timing import pinning


def get_executor(config: pytest.Config) -> Executor:
    """The session's executor, built on first use so collection-only runs start nothing."""
    executor = config.stash.get(executor_key, None)
    if executor is None:
        executor = _remote_executor(config) if get_settings(config).url else _local_executor(config)
        config.stash[executor_key] = executor
    return executor


def _remote_executor(config: pytest.Config) -> Executor:
    settings = get_settings(config)
    assert settings.url is not None
    return RemoteExecutor(settings, settings.url)


def _local_executor(config: pytest.Config) -> Executor:
    devices = get_devices(config)
    device_kind = "cuda" if any(d.is_cuda for d in devices) else "cpu"
    settings = get_settings(config)
    host_gpus = 0
    if device_kind == "cuda":
        slots = host_timing_slots(devices)
        host_gpus = len(slots)
        # before the template starts: it, and every child forked from it, stays off these cores
        pinning.reserve(slots, settings.timing_cpu)
    sandbox = None
    if settings.sandbox:
        sandbox = Sandbox(readonly=[config.rootpath, *settings.submissions], gpu=device_kind == "cuda")
        config.add_cleanup(sandbox.close)
        config.add_cleanup(isolation.stop_template)  # runs first: the template lives in the sandbox
    # the processes that may run at once: this session's workers, or one per GPU of the host
    cpu_threads = settings.cpu_threads or cpu_share.share(max(cpu_share.session_workers(config), host_gpus))
    return LocalExecutor(settings, lease_factory(config), device_kind, sandbox, cpu_threads=cpu_threads)


def close_executor(config: pytest.Config) -> None:
    """End the executor's children (or its client), if the session built one."""
    executor = config.stash.get(executor_key, None)
    if executor is not None:
        executor.close()
