"""The pytest entry point (``-p kcoral``): options, configuration and the hooks that wire the
pipeline together. The work itself lives in the modules named after each step."""

from __future__ import annotations

import pytest

from pytest_kcoral import options
from pytest_kcoral.options import Settings

settings_key = pytest.StashKey[Settings]()


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    # xdist workers must generate the same inputs as each other: the controller draws the seed.
    seed = workerinput.get("kcoral_seed") if workerinput else None
    config.stash[settings_key] = Settings.from_config(config, seed=seed)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # xdist controller hook: hand the session seed on
    node.workerinput["kcoral_seed"] = node.config.stash[settings_key].seed
