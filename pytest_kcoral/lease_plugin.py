"""The lease as pytest sees it: the session's ``LeaseManager``, the public ``gpu_lease`` fixture
and one xdist worker per device for ``-n auto``.

The options (``--kcoral-devices``, ``--kcoral-lease-dir``, ``--kcoral-lease-timeout``) belong to
``pytest_kcoral.options``; this module only reads them, falling back to the defaults when the main
plugin is not loaded (registering them here too would clash with it whichever loads second).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from pytest_kcoral.devices import DeviceSpec, visible_devices
from pytest_kcoral.lease import Lease, LeaseManager, worker_preferred_index
from pytest_kcoral.stash import devices_key, lease_manager_key


def _worker_id(config: pytest.Config) -> str | None:
    workerinput = getattr(config, "workerinput", None)
    return workerinput.get("workerid") if workerinput else None


def get_devices(config: pytest.Config) -> list[DeviceSpec]:
    """The devices this session grades on (discovered once, then cached on the config)."""
    if devices_key not in config.stash:
        config.stash[devices_key] = visible_devices(config.getoption("kcoral_devices", None))
    return config.stash[devices_key]


def get_lease_manager(config: pytest.Config) -> LeaseManager:
    """The session's ``LeaseManager``; built on first use, so the controller of an xdist run, which
    leases nothing, never creates it."""
    if lease_manager_key not in config.stash:
        devices = get_devices(config)
        lease_dir = config.getoption("kcoral_lease_dir", None)
        worker_id = _worker_id(config)
        config.stash[lease_manager_key] = LeaseManager(
            devices,
            Path(lease_dir) if lease_dir else None,
            config.getoption("kcoral_lease_timeout", None),
            holder=f"pytest-kcoral {worker_id or 'main'} in {config.rootpath} on {socket.gethostname()}",
            preferred=worker_preferred_index(worker_id, len(devices)),
        )
    return config.stash[lease_manager_key]


def lease_factory(config: pytest.Config) -> Callable[[str], AbstractContextManager[Lease]]:
    """``factory(label)`` leases a device for the ``with`` block: what the pipeline wraps its GPU
    stages in (the ``Lease`` has ``device_name``, ``wait_ms`` and, after release, ``held_ms``)."""
    manager = get_lease_manager(config)

    def factory(label: str) -> AbstractContextManager[Lease]:
        return manager.lease(label=label)

    return factory


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    # A bad --kcoral-devices is a usage error before anything runs, not an error in every item.
    get_devices(config)


@pytest.fixture
def gpu_lease(request: pytest.FixtureRequest) -> Iterator[Lease]:
    """Hold a device for the test: ``gpu_lease.device.name`` is the torch device string ("cuda:0"
    or "cpu"). Other tests, xdist workers and pytest sessions on this host wait their turn.

    The wait and hold times are recorded as user properties ``lease_wait_ms``/``lease_held_ms``
    (they reach ``--junitxml``)."""
    manager = get_lease_manager(request.config)
    with manager.lease(label=request.node.nodeid) as lease:
        yield lease
    request.node.user_properties.append(("lease_wait_ms", round(lease.wait_ms, 3)))
    if lease.held_ms is not None:  # None: a nested use of a lease held further out
        request.node.user_properties.append(("lease_held_ms", round(lease.held_ms, 3)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per GPU. None (xdist's CPU count) on a CPU-only machine, for
    ``-n logical``, or when ``PYTEST_XDIST_AUTO_NUM_WORKERS`` says how many."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.getoption("numprocesses", None) == "logical":
        return None
    devices = get_devices(config)
    if not any(d.is_cuda for d in devices):
        return None
    return len(devices)
