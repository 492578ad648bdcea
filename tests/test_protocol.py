"""The wire between the pytest process and a child: round trips, and forged messages refused."""

from __future__ import annotations

import io
import json
import multiprocessing
import struct
import threading
import time

import pytest
import torch

from pytest_kcoral import protocol


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else t


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(_raw(a), _raw(b))
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return type(a) is type(b) and a == b


PAYLOAD = {
    "inputs": [(torch.randn(3, 4), 5, 2.5, None, "text", True, torch.zeros(0, 3)),
               (torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, 1:],)],  # non-contiguous
    "bool": torch.tensor([True, False]),
    "bf16": torch.randn(5).to(torch.bfloat16),
    "complex": torch.randn(3, dtype=torch.complex64),
    "fp8": torch.randn(4).to(torch.float8_e4m3fn),
    "scalar": torch.tensor(1.5),
    "nan": float("nan"),
}


def _over_a_pipe(send):
    a, b = multiprocessing.Pipe()
    got: dict = {}

    def reader():
        try:
            got["message"] = protocol.recv(b)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got["error"] = exc

    thread = threading.Thread(target=reader)
    thread.start()
    send(a)
    thread.join(10)
    a.close()
    b.close()
    if "error" in got:
        raise got["error"]
    return got["message"]


def test_every_kind_of_value_survives_the_pipe():
    header, payload = _over_a_pipe(lambda conn: protocol.send(conn, {"cmd": "run", "seq": 3}, PAYLOAD))
    assert header == {"cmd": "run", "seq": 3, "payload": True}
    assert _same(PAYLOAD, payload)


def test_every_kind_of_value_survives_the_blob():
    assert _same(PAYLOAD, protocol.decode_payload(protocol.encode_payload(PAYLOAD)))


def test_a_message_without_payload():
    assert _over_a_pipe(lambda conn: protocol.send(conn, {"ok": True})) == ({"ok": True, "payload": False}, None)


def test_only_plain_values_can_be_sent():
    with pytest.raises(TypeError, match="not set"):
        protocol.encode_payload({"x": {1, 2}})
    with pytest.raises(TypeError, match="string keys"):
        protocol.encode_payload({1: torch.zeros(1)})


def _forged(skeleton, *frames: bytes):
    def send(conn):
        conn.send_bytes(json.dumps({"ok": True, "payload": True}).encode())
        conn.send_bytes(json.dumps(skeleton).encode())
        for f in frames:
            conn.send_bytes(f)
    return _over_a_pipe(send)


@pytest.mark.parametrize("skeleton, frames, message", [
    ({"tensor": 0, "dtype": "os", "shape": [1]}, [b"\0" * 4], "unknown dtype 'os'"),
    ({"tensor": 0, "dtype": "float32", "shape": [-1]}, [b""], "bad shape"),
    ({"tensor": 0, "dtype": "float32", "shape": [2]}, [b"\0" * 12], "a tensor frame of 12 bytes, but its shape [2] (torch.float32) needs 8"),
    ({"tensor": 0, "dtype": "float32", "shape": [2]}, [b"\0" * 4], "a tensor frame of 4 bytes, but its shape [2] (torch.float32) needs 8"),
    ({"tensor": 0, "dtype": "float32", "shape": [0]}, [b"\0"], "a tensor frame of 1 bytes, but its shape [0] (torch.float32) needs 0"),
    ([{"tensor": 1, "dtype": "float32", "shape": [1]}], [b"\0" * 4], "indices are not 0..n-1"),
    ({"__reduce__": ["os.system", ["true"]]}, [], "unexpected object"),
    ({"tuple": "abc"}, [], "unexpected object"),
])
def test_forged_payloads_are_refused(skeleton, frames, message):
    with pytest.raises(protocol.ProtocolError) as info:
        _forged(skeleton, *frames)
    assert message in str(info.value)


def test_pickles_are_never_loaded():
    pickled = io.BytesIO()
    torch.save({"x": torch.zeros(2)}, pickled)
    with pytest.raises(protocol.ProtocolError, match="not a pytest-kcoral payload blob"):
        protocol.decode_payload(pickled.getvalue())


def test_truncated_and_padded_blobs_are_refused():
    blob = protocol.encode_payload({"x": torch.zeros(4)})
    with pytest.raises(protocol.ProtocolError, match="truncated tensor"):
        protocol.decode_payload(blob[:-1])
    with pytest.raises(protocol.ProtocolError, match="bytes after the last tensor"):
        protocol.decode_payload(blob + b"\0")


def test_a_header_that_is_not_an_object_is_refused():
    with pytest.raises(protocol.ProtocolError, match="not a JSON object"):
        _over_a_pipe(lambda conn: conn.send_bytes(b"[1, 2]"))


def test_a_message_begun_and_never_finished_times_out():
    a, b = multiprocessing.Pipe()
    try:
        a.send_bytes(json.dumps({"ok": True, "payload": True}).encode())
        a.send_bytes(json.dumps({"tensor": 0, "dtype": "float32", "shape": [1 << 20]}).encode())
        a._send(b"\x00\x40\x00\x00" + b"\0" * 1000)  # a 4 MiB frame's length, then a thousand bytes of it
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            protocol.recv(b, deadline=started + 0.5)
        assert 0.5 <= time.monotonic() - started < 5
    finally:
        a.close()
        b.close()


def test_the_channel_closing_mid_message_is_end_of_file():
    a, b = multiprocessing.Pipe()
    a.send_bytes(json.dumps({"ok": True, "payload": True}).encode())
    a.send_bytes(json.dumps({"tensor": 0, "dtype": "float32", "shape": [4]}).encode())
    a._send(b"\x00\x00\x00\x10" + b"\0" * 7)
    a.close()
    with pytest.raises(EOFError):
        protocol.recv(b, deadline=time.monotonic() + 5)
    b.close()


def test_an_oversized_header_frame_is_refused_before_it_is_read():
    a, b = multiprocessing.Pipe()
    a._send(struct.pack("!i", protocol.MAX_HEADER_BYTES + 1))  # the length alone; no bytes follow
    with pytest.raises(protocol.ProtocolError, match="more than the .* allowed"):
        protocol.recv(b, deadline=time.monotonic() + 5)
    a.close()
    b.close()


def test_large_tensors_arrive_whole():
    big = {"x": torch.randn(3 << 20), "y": torch.arange(1 << 20, dtype=torch.int64)}
    header, payload = _over_a_pipe(lambda conn: protocol.send(conn, {"ok": True}, big))
    assert _same(big, payload)
