"""What a candidate's process printed, shown as pytest shows a test's output.

A child's stdout and stderr arrive on two pipes, drained in the pytest process
(``isolation._OutputDrain``). Each stream keeps only its last lines (``StreamTail``): a candidate
that prints gigabytes costs a read per 64 KiB, never memory or disk. What is kept becomes:

- the item's ``output_tail`` in the JSON (``record``);
- ``Captured stdout call`` / ``Captured stderr call`` sections of its pytest report (``sections``);
- with ``-s``, the output itself, written to the terminal as it comes (``LiveWriter``).
"""

from __future__ import annotations

import codecs
import os
import re
import sys
import sysconfig
import threading
from typing import Any

STREAMS = ("stdout", "stderr")
TAIL_LINES = 200  # lines of each stream kept for the report and the JSON
TAIL_BYTES = 16 << 10  # and at most this many bytes of them (200 long lines would not fit)
LIVE_LIMIT_BYTES = 1 << 20  # per stream and process, written live under -s; a flood stops there


class StreamTail:
    """The last ``TAIL_BYTES`` of one stream, and the bytes and lines that went by in all."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.total_bytes = 0
        self.total_lines = 0  # newlines seen, plus one for a last line without its newline

    def feed(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        self.total_lines += chunk.count(b"\n")
        self.kept += chunk
        if len(self.kept) > 2 * TAIL_BYTES:  # trimmed now and then, not at every read
            del self.kept[: len(self.kept) - TAIL_BYTES]

    def summary(self) -> dict[str, Any]:
        """``{"text", "bytes", "lines"}``: the last lines (at most ``TAIL_LINES`` and
        ``TAIL_BYTES``, from a line's start unless one line is longer than that), and how much
        the stream held in all."""
        kept = bytes(self.kept[-TAIL_BYTES:])
        if len(self.kept) > TAIL_BYTES and b"\n" in kept[:-1]:
            kept = kept[kept.index(b"\n") + 1:]  # no half line at the top
        lines = kept.splitlines(keepends=True)[-TAIL_LINES:]
        unterminated = 0 if not self.kept or self.kept.endswith(b"\n") else 1
        return {"text": b"".join(lines).decode(errors="replace"), "bytes": self.total_bytes, "lines": self.total_lines + unterminated}


def record(tails: dict[str, StreamTail]) -> dict[str, Any] | None:
    """The item's ``output_tail``: per stream ``{"text", "bytes", "lines"}``, or None when the
    process printed nothing."""
    if not any(t.total_bytes for t in tails.values()):
        return None
    return {name: tails[name].summary() for name in STREAMS}


def cut_from(output_tail: dict[str, Any], stream: str, marker: str) -> dict[str, Any] | None:
    """``output_tail`` without ``stream``'s text from the last line that starts with ``marker`` on
    (what the harness printed there), its counts made to match; None if nothing is left."""
    kept = output_tail[stream]
    text = kept["text"]
    at = text.rfind("\n" + marker)
    at = at + 1 if at >= 0 else (0 if text.startswith(marker) else -1)
    if at < 0:
        return output_tail
    cut = text[at:]
    output_tail = dict(output_tail, **{stream: {"text": text[:at], "bytes": max(0, kept["bytes"] - len(cut.encode())),
                                                "lines": max(0, kept["lines"] - len(cut.splitlines()))}})
    return output_tail if any(output_tail[name]["bytes"] for name in STREAMS) else None


def sections(output_tail: dict[str, Any] | None) -> list[tuple[str, str]]:
    """``(stream, text)`` for each stream that printed: the kept lines, with a first line saying
    what was cut when the stream held more."""
    found = []
    for name in STREAMS:
        stream = (output_tail or {}).get(name)
        if not stream or not stream.get("bytes"):
            continue
        text = stream["text"]
        shown_lines = len(text.splitlines())
        shown_bytes = len(text.encode())
        if stream["bytes"] > shown_bytes:
            cut_lines = max(0, stream["lines"] - shown_lines)
            note = (f"[kcoral: the first {cut_lines} of {stream['lines']} lines ({_size(stream['bytes'] - shown_bytes)}) are cut;"
                    f" the last {shown_lines} follow]\n")
            text = note + text
        found.append((name, text))
    return found


def _size(n_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} bytes"


class LiveWriter:
    """Writes one stream of a child to this process's own (``-s``: nothing captures it), up to
    ``LIVE_LIMIT_BYTES``; past that, one line says the rest is not shown."""

    _lock = threading.Lock()  # one child's chunk at a time, not interleaved mid-line with another's

    def __init__(self, stream: str, label: str) -> None:
        self.stream = stream
        self.label = label
        self.written = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a chunk may end inside a character

    def write(self, chunk: bytes) -> None:
        if self.written >= LIVE_LIMIT_BYTES:
            return
        room = LIVE_LIMIT_BYTES - self.written
        self.written += len(chunk)
        text = self.decoder.decode(chunk[:room])
        if self.written >= LIVE_LIMIT_BYTES:
            text += f"\n[kcoral: {self.label} printed over {_size(LIVE_LIMIT_BYTES)} to {self.stream}; the rest is not shown]\n"
        target = sys.stdout if self.stream == "stdout" else sys.stderr
        try:
            with self._lock:
                target.write(text)
                target.flush()
        except (OSError, ValueError, AttributeError):  # a closed or replaced stream: the tail still has it
            pass

# -- where a child was at its deadline: the stacks it printed then (``child.serve``) ---------------

_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
_DUMP_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
# Frames of the harness and of Python's and the packages' own code: not where a kernel author looks.
_NOT_THEIRS = (_HARNESS_DIR, *(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")),
               "<")  # "<frozen ...>", and the template's "<string>"


STACK_DUMP_START = "Timeout ("  # faulthandler's first line


def stack_at_timeout(output: str) -> tuple[str, str]:
    """Where a timed-out child was, from the stacks ``faulthandler`` printed just before the
    deadline: `` at FILE:LINE in FUNC`` for the innermost frame of the candidate's or the case's
    code (empty when there is none), and the output with the dump cut down to those frames."""
    start = output.rfind(STACK_DUMP_START)
    if start < 0:
        return "", output
    frames = [m for m in (_DUMP_FRAME.match(line) for line in output[start:].splitlines()) if m]
    theirs = [m for m in frames if not m["file"].startswith(_NOT_THEIRS)]
    kept = output[:start].rstrip("\n")
    if not theirs:
        return "", kept
    stack = "\n".join(f"  {m['file']}:{m['line']} in {m['func']}" for m in theirs[:6])
    top = theirs[0]
    where = f" at {os.path.basename(top['file'])}:{top['line']} in {top['func']}"
    return where, (kept + "\n" if kept else "") + f"stack at the timeout, innermost first (harness and library frames left out):\n{stack}"
