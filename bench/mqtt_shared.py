"""``topicwire bench mqtt-shared``: a shared subscription group across two edges
(``mqtt.shared_namespace``, appliance/edge/mqtt/shared_view.py) while the view changes.

An edge-core-edge fabric in this process (tests/edge/test_fabric_metadata.py's builder), a
member of ``$share/g/s/#`` at each edge (paho, MQTT 5), a paho publisher at edge A sending
QoS 1 messages at ``--rate`` for ``--duration-s``. Per repeat, two runs of the same load:

- ``stable_view`` (the baseline): nothing changes; every message should reach one member.
- ``topicwire`` (view changes): a quarter of the way in, the member at edge B unsubscribes
  (edge B withdraws), half way in it subscribes again (edge B announces the group
  ``JOIN_GRACE_S`` later, while the publisher goes on).

Figures: ``lost`` (published, acknowledged, not delivered 3 s after the last
acknowledgement),
of them ``lost_at_leave`` published from the UNSUBSCRIBE to the SUBSCRIBE and
``lost_at_join`` after it), ``duplicates`` (deliveries beyond one per message; of them
``duplicates_at_leave`` and ``duplicates_at_join`` of messages published in those spans),
``leave_view_ms`` (from the UNSUBSCRIBE sent at edge B until edge A's view, polled every
5 ms, shows edge A alone) and ``join_view_ms`` (from the SUBSCRIBE until edge A's view shows
both). Medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections import Counter
from typing import Any

from bench.report import build_report, positive_int, progress

NAME = "mqtt-shared"
HELP = ("a shared subscription group across two edges while an edge leaves and joins: "
        "messages lost and duplicated, view change time (vs a stable view)")
NS = 11
GROUP = "g/s/#"
SETTLE_S = 3.0
"""How long after the last publish deliveries may still come."""
POLL_S = 0.005


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=positive_int, default=200,
                        help="QoS 1 publishes per second (default 200)")
    parser.add_argument("--duration-s", type=float, default=4.0,
                        help="publishing time per run (default 4)")
    parser.add_argument("--repeats", type=positive_int, default=3)


def _entitle(doc_a: dict) -> None:
    doc_a["appliance"]["namespaces"] = [0, NS]
    doc_a["pm"]["identities"]["edges"] = {"publish": ["#"], "subscribe": ["#"],
                                          "namespaces": [NS]}


def _view(edge: Any) -> list[int] | None:
    return edge.mqtt.status()["shared"]["groups"].get(GROUP)


def _wait(predicate: Any, what: str, timeout_s: float = 30.0) -> float:
    """Seconds until ``predicate`` holds (polled every ``POLL_S``)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise RuntimeError(f"bench {NAME}: {what} not within {timeout_s} s")
        time.sleep(POLL_S)
    return time.monotonic() - start


def _one_run(edge_a: Any, edge_b: Any, pub: Any, members: list[Any], run: str, rate: int,
             duration_s: float, change: bool) -> dict[str, float]:
    ids = sorted([edge_a.config.node_id, edge_b.config.node_id])
    _wait(lambda: _view(edge_a) == ids and _view(edge_b) == ids, "both edges in the view")
    got: list[bytes] = []
    lock = threading.Lock()
    for member in members:
        member.client.on_message = lambda _c, _u, m: (lock.acquire(), got.append(m.payload),
                                                      lock.release())
    total = int(rate * duration_s)
    infos = []
    figures: dict[str, float] = {}

    def publish() -> None:
        start = time.monotonic()
        for i in range(total):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            infos.append(pub.client.publish(f"s/{i}", f"{run}-{i}".encode(), 1))

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    marks = [total, total]
    if change:
        began = time.monotonic()
        time.sleep(duration_s / 4)
        marks[0] = len(infos)
        start = time.monotonic()
        members[1].unsubscribe("$share/" + GROUP)
        figures["leave_view_ms"] = 1e3 * (time.monotonic() - start + _wait(
            lambda: _view(edge_a) == [edge_a.config.node_id], "edge A's view without edge B"))
        time.sleep(max(0.0, began + duration_s / 2 - time.monotonic()))
        marks[1] = len(infos)
        start = time.monotonic()
        members[1].subscribe("$share/" + GROUP, 1)
        figures["join_view_ms"] = 1e3 * (time.monotonic() - start + _wait(
            lambda: _view(edge_a) == ids, "edge A's view with edge B"))
    thread.join()
    for info in infos:
        info.wait_for_publish(30)
    deadline = time.monotonic() + SETTLE_S
    while True:  # (every message delivered, or the time for late ones ran out)
        with lock:
            mine = [p for p in got if p.startswith(f"{run}-".encode())]
        seen = {int(p.rsplit(b"-", 1)[1]) for p in mine}
        if len(seen) == total or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    lost = [i for i in range(total) if i not in seen]
    figures["lost"] = len(lost)
    figures["lost_at_leave"] = sum(1 for i in lost if marks[0] <= i < marks[1])
    figures["lost_at_join"] = sum(1 for i in lost if i >= marks[1])
    figures["duplicates"] = len(mine) - len(seen)
    copies = Counter(int(p.rsplit(b"-", 1)[1]) for p in mine)
    figures["duplicates_at_leave"] = sum(n - 1 for i, n in copies.items()
                                         if marks[0] <= i < marks[1])
    figures["duplicates_at_join"] = sum(n - 1 for i, n in copies.items() if i >= marks[1])
    figures["published"] = total
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.edge.peers import Peer
    from tests.edge.test_fabric_metadata import _peer_b, _ready, edge_core_edge

    runs: dict[str, list[dict[str, float]]] = {"topicwire": [], "stable_view": []}
    with edge_core_edge({"shared_namespace": NS, "shared_identity": "edges"},
                        _entitle) as (edge_a, edge_b, _):
        for edge in (edge_a, edge_b):
            _wait(lambda e=edge: e.mqtt.status()["shared"]["logged_in"], "the view's login")
        with Peer(edge_a, "bs-a", version=5) as member_a, Peer(edge_a, "bs-pub") as pub, \
                _peer_b(edge_b, "bs-b") as member_b:
            for member in (member_a, member_b):
                member.subscribe("$share/" + GROUP, 1)
                member.subscribe("ready/#", 0)
            _ready(pub, [member_a, member_b], "ready")  # edge B's interest reached edge A
            for r in range(args.repeats):
                for name, change in (("stable_view", False), ("topicwire", True)):
                    progress(NAME, f"repeat {r + 1}/{args.repeats}: {name}")
                    runs[name].append(_one_run(edge_a, edge_b, pub, [member_a, member_b],
                                               f"{name}{r}", args.rate, args.duration_s,
                                               change))
    results = {name: {k: statistics.median(f[k] for f in figures) for k in figures[0]}
               for name, figures in runs.items()}
    params = {"rate": args.rate, "duration_s": args.duration_s, "repeats": args.repeats,
              "runs": runs}
    return build_report(NAME, params, results)
