"""The wire between the pytest process and a child: JSON headers and tensor payloads.

Nothing a child sends is ever unpickled by the parent: headers are JSON, and tensors travel in
``torch.save`` format read back with ``weights_only=True``, which restores plain tensors and
containers and refuses arbitrary objects. A candidate that forges a message can only send data.
"""

from __future__ import annotations

import io
import json
from multiprocessing.connection import Connection
from typing import Any

# A header never needs more; anything larger is a child flooding the channel.
MAX_HEADER_BYTES = 8 << 20


class ProtocolError(Exception):
    """The other side sent something that is not a valid message."""


def send(conn: Connection, header: dict[str, Any], payload: Any = None) -> None:
    header = dict(header, payload=payload is not None)
    conn.send_bytes(json.dumps(header).encode())
    if payload is not None:
        conn.send_bytes(encode_payload(payload))


def recv(conn: Connection) -> tuple[dict[str, Any], Any]:
    raw = conn.recv_bytes(MAX_HEADER_BYTES)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"unreadable message header: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("message header is not a JSON object")
    payload = decode_payload(conn.recv_bytes()) if header.get("payload") else None
    return header, payload


def encode_payload(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def decode_payload(data: bytes) -> Any:
    import torch

    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # a forged or corrupted payload
        raise ProtocolError(f"unreadable tensor payload: {type(exc).__name__}: {exc}") from None
