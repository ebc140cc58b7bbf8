"""``Client.replay``: the messages an appliance's cache keeps, page by page.

Each page is one REPLAY request (``{"id", "pattern", "namespace", "from_seq" |
"from_time_ns"}``) answered by one REPLAY_RESULT (``messages``, ``next_seq``, ``done``); the
next page asks ``from_seq = next_seq``, so the appliance keeps no state between pages and a
lost request or answer costs a repeat (same id, same page), not the replay. The first page is
asked for when ``replay`` is called, so a refusal raises there; the rest as the generator is
consumed (one page in memory at a time).
"""

from __future__ import annotations

import base64
import binascii
import itertools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from appliance.client.errors import ClientError, EntitlementError
from appliance.client.messages import Message
from datapath.protocol import admin_layout as al
from datapath.topics.algebra import split_pattern

if TYPE_CHECKING:
    from appliance.client.api import Client

_IDS = itertools.count(1)


def _check(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise ClientError(f"replay: {name} must be an integer in [0, 2^63), not {value!r}")
    return value


def replay(client: Client, pattern: str, from_time_ns: int | None,
           from_sequence: int | None, namespace: int) -> Iterator[Message]:
    """See ``Client.replay``."""
    if not isinstance(pattern, str):
        raise ClientError(f"replay: pattern must be a string, not {type(pattern).__name__}")
    split_pattern(pattern)
    from_time_ns = _check("from_time_ns", from_time_ns)
    from_sequence = _check("from_sequence", from_sequence)
    if from_time_ns is not None and from_sequence is not None:
        raise ClientError("replay: give from_time_ns or from_sequence, not both")
    if isinstance(namespace, bool) or not isinstance(namespace, int) or not (
            0 <= namespace < 2**32):
        raise ClientError(f"replay: namespace must be an integer in [0, 2^32), not "
                          f"{namespace!r}")
    client._check_usable()
    start: dict[str, int] = {}
    if from_time_ns is not None:
        start["from_time_ns"] = from_time_ns
    elif from_sequence is not None:
        start["from_seq"] = from_sequence
    first = _page(client, pattern, namespace, start)
    return _pages(client, pattern, namespace, first)


def _page(client: Client, pattern: str, namespace: int, start: dict[str, int]) -> dict:
    rid = next(_IDS) % 2**32 or next(_IDS)
    doc = {"id": rid, "pattern": pattern, "namespace": namespace, **start}
    result = client._request(("replay", rid), lambda: client._control(al.ControlKind.REPLAY,
                                                                       doc),
                             repeatable=True)
    if not result.get("accepted"):
        reason = result.get("reason")
        if result.get("why") == "entitlement":
            raise EntitlementError(f"replay of {pattern!r} refused: {reason}")
        raise ClientError(f"replay of {pattern!r} refused: {reason}")
    return result


def _pages(client: Client, pattern: str, namespace: int, page: dict) -> Iterator[Message]:
    while True:
        wall = time.time_ns()
        for row in page["messages"]:
            (cache_seq, topic, ns, key, seq, ts, schema, qos, origin, stream, text) = row
            try:
                payload = base64.b64decode(text, validate=True)
            except binascii.Error:
                raise ClientError(f"replay of {pattern!r}: the appliance sent a payload that "
                                  "is not base64") from None
            yield Message(topic, payload, key, seq, ts, ns, schema, qos, origin, stream, wall,
                          cache_seq=cache_seq)
        if page["done"]:
            return
        page = _page(client, pattern, namespace, {"from_seq": page["next_seq"]})
