"""A pytest plugin for ``bench/role_bias.py`` only: every item gets a fresh trusted child.

The grader keeps one trusted child per case across items (``LocalExecutor._trusted_child``) while
every candidate gets a fresh process. Closing the kept children before each item shows whether the
baseline's process age, rather than its code, moves its timings.
"""

from __future__ import annotations

from pytest_kcoral.pipeline import LocalExecutor

_run = LocalExecutor.run


def _run_with_a_fresh_trusted_child(self: LocalExecutor, spec):  # noqa: ANN001, ANN202 - LocalExecutor.run's own
    self.close()
    return _run(self, spec)


LocalExecutor.run = _run_with_a_fresh_trusted_child
