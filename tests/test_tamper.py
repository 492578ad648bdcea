"""The tamper check (``tamper.Snapshot``), in this process: what it names, and what it leaves."""

from __future__ import annotations

import time

import torch

from pytest_kcoral import tamper
from pytest_kcoral.timing import stats


def test_a_replaced_function_and_a_replaced_code_object_are_named_and_restoring_clears_them(monkeypatch):
    snapshot = tamper.Snapshot.take()
    assert snapshot.changed() == []
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert snapshot.changed() == ["time.perf_counter"]
    monkeypatch.undo()
    assert snapshot.changed() == []
    # the same function object doing something else
    original = stats.median.__code__
    monkeypatch.setattr(stats.median, "__code__", (lambda values: 0.0).__code__)
    assert snapshot.changed() == ["pytest_kcoral.timing.stats.median.__code__"]
    monkeypatch.setattr(stats.median, "__code__", original)
    assert snapshot.changed() == []


def test_a_deleted_name_and_a_function_replaced_by_an_object_without_code_are_named(monkeypatch):
    snapshot = tamper.Snapshot.take()
    monkeypatch.delattr(time, "monotonic")
    monkeypatch.setattr(stats, "median", object())
    assert set(snapshot.changed()) == {"time.monotonic", "pytest_kcoral.timing.stats.median", "pytest_kcoral.timing.stats.median.__code__"}


def test_a_replacement_that_claims_to_equal_everything_is_named(monkeypatch):
    """The check goes by identity: an object whose ``__eq__`` says True to all is still another object."""

    class EqualToAll:
        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    snapshot = tamper.Snapshot.take()
    monkeypatch.setattr(torch, "allclose", EqualToAll())
    monkeypatch.setattr(torch.Tensor, "clone", EqualToAll(), raising=False)
    assert set(snapshot.changed()) >= {"torch.allclose"}
    assert any(name.startswith("torch.Tensor.clone") for name in snapshot.changed())


def test_a_method_of_a_watched_base_set_on_the_class_is_named_and_new_names_are_not(monkeypatch):
    """``torch.Tensor.copy_ = ...`` adds a name to ``torch.Tensor`` over the ``TensorBase`` method
    the harness calls; a name no watched base has (a library's lazy attribute) is no change."""
    snapshot = tamper.Snapshot.take()
    monkeypatch.setattr(torch.Tensor, "kcoral_new_name", 1, raising=False)
    assert snapshot.changed() == []
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, other: self, raising=False)
    assert snapshot.changed() == ["torch.Tensor.copy_ (over a method of its base torch._C.TensorBase)"]
    monkeypatch.undo()
    assert snapshot.changed() == []
