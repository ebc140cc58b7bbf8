"""``topicwire bench selectors-fabric``: selectors evaluated in the appliance vs in the clients.

One appliance (its data path in a process of its own, as deployed), one publisher and
``--clients`` subscriber clients holding ``--subscribers`` selector subscriptions between them
(each on ``md/#``, at most ``MAX_SELECTORS_PER_SESSION`` per client). Two designs, measured
in the same run on the same appliance, workload and clients' share of the selectors:

- ``topicwire``: the selector travels in the SUBSCRIBE; the appliance matches each message
  once against every session's selectors (one ``SelectorIndex``) and sends a client only the
  messages one of its selectors wants (docs/selectors.md, "In the fabric");
- ``in_clients`` (the design before): the subscriptions carry no selector, every message of
  the topic goes to every client, and each client evaluates its subscriptions' selectors one
  by one (``Client._dispatch``).

The workload is market data: a quote (schema ``quote``: symbol, price in cents, qty, side)
on one topic, symbols drawn with popular ones far more often; interest is partitioned as a
desk's would be: client ``i`` asks about its own symbols (every ``clients``-th one), with
selectors such as ``symbol = 'S0042' AND price > 10150``. Per repeat the publisher sends
``--messages`` quotes as fast as it can; the figure is messages published per second until
every client has received what its subscriptions take (each Subscription's expected count
is computed beforehand with ``SelectorIndex``; a repeat ends early, and says so in
``lost``, when nothing arrives for ``IDLE_END_S``). Bytes sent to clients are the
appliance's client channel ``bytes_out`` over the repeat. The clients run in this process
(one interpreter, one GIL), so their evaluation competes with receiving, as several
clients on one host would. Progress goes to stderr, the report (``bench.report``) to stdout.
"""

from __future__ import annotations

import argparse
import random
import socket
import threading
import time
from collections import Counter
from typing import Any

from bench.report import build_report, positive_int, progress
from datapath.errors import TopicwireError

NAME = "selectors-fabric"
HELP = "messages/s through one appliance: selectors evaluated in the appliance vs the clients"

QUOTE = {"id": 7, "fields": [["symbol", 0, "ascii", 8], ["price", 8, "u32"],
                             ["qty", 12, "u32"], ["side", 16, "ascii", 1]]}
TOPIC = "md/quotes"
SESSION_DEAD_MS = 600_000
"""The bench appliance keeps a silent client's session this long."""
IDLE_END_S = 5.0
"""A repeat ends when no client received anything for this long (best-effort loss)."""
SHAPES = (
    (0.5, "symbol = '{s}' AND price > {p}"),
    (0.3, "symbol IN ('{s}', '{s2}') AND qty >= {q}"),
    (0.2, "symbol = '{s}' AND (side = 'B' OR qty > {q})"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options."""
    parser.add_argument("--subscribers", type=positive_int, default=10_000,
                        help="selector subscriptions, all clients together (default 10000)")
    parser.add_argument("--clients", type=positive_int, default=50,
                        help="subscriber clients (raised to hold --subscribers at the "
                             "per-session limit; default 50)")
    parser.add_argument("--messages", type=positive_int, default=2_000,
                        help="quotes published per repeat (default 2000)")
    parser.add_argument("--symbols", type=positive_int, default=2_000,
                        help="distinct symbols (default 2000)")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="repeats per design, medians reported (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")


def _symbol(rng: random.Random, symbols: int) -> int:
    return min(symbols - 1, int(symbols * rng.random() ** 3))


def selector_plan(args: argparse.Namespace, clients: int, rng: random.Random
                  ) -> list[list[str]]:
    """Per client, its selector texts (client i's symbols: those = i mod clients)."""
    owned = [[s for s in range(args.symbols) if s % clients == i] or [i % args.symbols]
             for i in range(clients)]
    shapes = [s for _, s in SHAPES]
    weights = [w for w, _ in SHAPES]
    plan: list[list[str]] = [[] for _ in range(clients)]
    for n in range(args.subscribers):
        i = n % clients
        mine = owned[i]
        price = rng.randrange(8_000, 12_000)
        plan[i].append(rng.choices(shapes, weights)[0].format(
            s=f"S{rng.choice(mine):04d}", s2=f"S{rng.choice(mine):04d}", p=price,
            q=rng.randrange(1, 1_000)))
    return plan


def quotes(args: argparse.Namespace, rng: random.Random) -> list[dict[str, Any]]:
    return [{"symbol": f"S{_symbol(rng, args.symbols):04d}",
             "price": rng.randrange(7_000, 13_000), "qty": rng.randrange(1, 1_500),
             "side": rng.choice("BS")} for _ in range(args.messages)]


def _port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client_bytes_out(app: Any) -> int:
    return sum(int(row["bytes_out"]) for row in app.status()["channels"]
               if row["name"].startswith("clients"))


def _settled_bytes_out(app: Any) -> int:
    """The client channels' bytes_out once the status shows no more change (it is refreshed
    about every second)."""
    last, deadline = -1, time.monotonic() + 5.0
    while time.monotonic() < deadline:
        now = _client_bytes_out(app)
        if now == last:
            return now
        last = now
        time.sleep(1.1)
    return last


def _subscribe_all(clients: list, plan: list[list[str]], in_appliance: bool) -> list[list]:
    """Every client's subscriptions (one thread per client: the appliance answers a round of
    them with one table build)."""
    from nic_offload.selectors import compile_selector

    subs: list[list] = [[] for _ in clients]
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            for text in plan[i]:
                if in_appliance:
                    sub = clients[i].subscribe("md/#", text, callback=_ignore)
                else:  # before: no selector in the SUBSCRIBE; the client evaluates it
                    sub = clients[i].subscribe("md/#", callback=_ignore)
                    sub.selector = compile_selector(text)
                subs[i].append(sub)
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return subs


def _ignore(_msg: Any) -> None:
    pass


def _expected(plan: list[list[str]], events: list[dict]) -> tuple[list[list[int]], int]:
    """Per client and subscription, how many of ``events`` it takes; and how many
    (client, message) deliveries the appliance makes when it filters."""
    from nic_offload.selectors import SelectorIndex

    index = SelectorIndex()
    for i, texts in enumerate(plan):
        for j, text in enumerate(texts):
            index.add((i, j), text)
    counts: Counter = Counter()
    sends = 0
    for event in events:
        found = index.match(event)
        counts.update(found)
        sends += len({i for i, _ in found})
    return [[counts[(i, j)] for j in range(len(t))] for i, t in enumerate(plan)], sends


def _repeat(app: Any, pub: Any, payloads: list[bytes], subs: list[list],
            expected: list[list[int]]) -> dict[str, float]:
    before_bytes = _settled_bytes_out(app)
    base = [[s.delivered for s in row] for row in subs]
    want = sum(map(sum, expected))
    start = time.perf_counter()
    for payload in payloads:
        pub.publish(TOPIC, payload, schema_id=QUOTE["id"])
    pub.flush()
    got, last_change, last_got = 0, time.monotonic(), -1
    while True:
        got = sum(min(s.delivered - b, e) for row, brow, erow in zip(subs, base, expected)
                  for s, b, e in zip(row, brow, erow))
        if got >= want:
            break
        if got != last_got:
            last_got, last_change = got, time.monotonic()
        elif time.monotonic() - last_change > IDLE_END_S:
            break
        time.sleep(0.01)  # (the sum reads 10,000 counters: not too often, same GIL)
    elapsed = time.perf_counter() - start - (0.0 if got >= want else IDLE_END_S)
    extra = sum(max(s.delivered - b - e, 0) for row, brow, erow in zip(subs, base, expected)
                for s, b, e in zip(row, brow, erow))
    sent = _settled_bytes_out(app) - before_bytes
    return {"msgs_per_s": len(payloads) / elapsed, "elapsed_s": elapsed,
            "bytes_to_clients": sent, "lost": want - got, "wrong": extra}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark; returns the report (``bench.report.build_report``)."""
    from appliance.client import connect
    from appliance.config import MAX_SELECTORS_PER_SESSION, parse_config
    from appliance.node import Appliance
    from nic_offload.schema import Schema

    rng = random.Random(args.seed)
    clients_n = max(args.clients, -(-args.subscribers // MAX_SELECTORS_PER_SESSION))
    plan = selector_plan(args, clients_n, rng)
    events = quotes(args, rng)
    schema = Schema.of("quote", QUOTE["id"], [tuple(f) for f in QUOTE["fields"]])
    payloads = [schema.encode(e) for e in events]
    progress(NAME, f"{args.subscribers} selectors over {clients_n} clients; expected "
                   "deliveries")
    expected, appliance_sends = _expected(plan, events)
    port = _port()
    app = Appliance(parse_config({
        "appliance": {"name": f"selfab{port}"},
        # clients busy evaluating (the in-clients design) may not heartbeat for a while: they
        # must not be logged out in the middle of a repeat
        "clients": {"udp": f"127.0.0.1:{port}", "session_dead_ms": SESSION_DEAD_MS},
        "log": {"level": "warning"},
        "pm": {"schemas": {"quote": QUOTE}, "require_passwords": False,
               "identities": {"bench": {"publish": ["#"], "subscribe": ["#"]}}}})).start()
    url = f"udp://127.0.0.1:{port}"
    results: dict[str, dict[str, float]] = {}
    try:
        with connect(url, "bench", session_timeout_s=600.0) as pub:
            pub.publish(TOPIC, payloads[0], schema_id=QUOTE["id"])  # registers the topic
            pub.flush()
            for design, in_appliance in (("topicwire", True), ("in_clients", False)):
                clients = [connect(url, "bench", timeout_s=60.0, session_timeout_s=600.0)
                           for _ in range(clients_n)]
                try:
                    progress(NAME, f"{design}: subscribing")
                    start = time.perf_counter()
                    subs = _subscribe_all(clients, plan, in_appliance)
                    subscribe_s = time.perf_counter() - start
                    runs = []
                    for r in range(args.repeats):
                        progress(NAME, f"{design}: repeat {r + 1}/{args.repeats}")
                        runs.append(_repeat(app, pub, payloads, subs, expected))
                    if any(run["wrong"] for run in runs):
                        raise TopicwireError(f"{design}: subscriptions received messages "
                                             "their selectors do not take; a bug",
                                             component="bench")
                    results[design] = {
                        "msgs_per_s": _median([x["msgs_per_s"] for x in runs]),
                        "bytes_to_clients": _median([x["bytes_to_clients"] for x in runs]),
                        "lost": _median([x["lost"] for x in runs]),
                        "subscribe_s": subscribe_s,
                    }
                finally:
                    for c in clients:
                        c.close()
            filtered = int(app.status()["offload"].get("selector_filtered", 0))
    finally:
        app.stop()
    params = {
        "subscribers": args.subscribers, "clients": clients_n, "messages": args.messages,
        "symbols": args.symbols, "repeats": args.repeats, "seed": args.seed,
        "deliveries_expected": sum(map(sum, expected)),
        "client_messages_appliance_design": appliance_sends,
        "client_messages_client_design": clients_n * args.messages,
        "selector_filtered_total": filtered,
    }
    progress(NAME, "done")
    return build_report(NAME, params, results)
