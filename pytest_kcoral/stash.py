"""Where the plugin keeps per-run state: every ``pytest.StashKey`` it hangs off ``config.stash``
or ``item.stash``, in one place, with the getters that read them.

The hooks (``plugin``), the nodes (``items``), the reports (``session``) and the lease
(``lease_plugin``) all import this module, and it imports none of them, so none of them needs
another's import at call time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import pytest

from pytest_kcoral.context import Executor
from pytest_kcoral.devices import DeviceSpec
from pytest_kcoral.lease import LeaseManager
from pytest_kcoral.options import Settings
from pytest_kcoral.results import ItemResult


class SessionLog(Protocol):
    """What other modules may add to the registered ``session.KcoralSession``: lease events."""

    lease_history: list[dict[str, Any]]

# -- config.stash --------------------------------------------------------------------------------

# the validated options (``options.Settings``), set by ``plugin.pytest_configure``
settings_key = pytest.StashKey[Settings]()
# the session's executor, built on first use (``executors.get_executor``)
executor_key = pytest.StashKey[Executor]()
# (case folder, item name, the argument as given) per case id given as an argument
selection_key = pytest.StashKey[list[tuple[str, str, str]]]()
# submission files some collected case took -> the ids of the cases that took each
submissions_matched_key = pytest.StashKey[dict[Path, set[str]]]()
# the registered session, for modules that add to it (``config.stash[session_key].lease_history``)
session_key = pytest.StashKey[SessionLog]()
# the devices this session grades on, and the session's lease manager (``lease_plugin``)
devices_key = pytest.StashKey[list[DeviceSpec]]()
lease_manager_key = pytest.StashKey[LeaseManager]()

# -- item.stash ----------------------------------------------------------------------------------

# an item's record, once it ran (``items.KernelItem.runtest``)
result_key = pytest.StashKey[ItemResult]()


def get_settings(config: pytest.Config) -> Settings:
    """The session's validated options (``plugin.pytest_configure`` sets them first)."""
    return config.stash[settings_key]


def settings_or_none(config: pytest.Config) -> Settings | None:
    """The session's options, or None before ``plugin.pytest_configure`` (or without the plugin)."""
    return config.stash.get(settings_key, None)
