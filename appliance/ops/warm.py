"""``topicwire warm`` (run by ``make setup``): compile every kernel with the argument types
production uses, by running real traffic of every kind once, into numba's cache.

A kernel compiles the first time it meets a signature; compiling takes seconds and holds the
interpreter, so on a live appliance it stops the duty cycles and requests time out. This
command runs, in one process, a small fabric of three appliances (P&M with a unicast
neighbour; two cores on a UDP multicast fabric group when loopback multicast is available,
unicast otherwise), clients over UDP and shared memory at each, and traffic of every kind:
best-effort and guaranteed messages, bursts from several publishers at once, single
flushed messages, selectors on a schema, messages for keys registered a moment ago (parked
and rerun at the appliances), local and remote subscribers, path telemetry windows. Every
signature it compiled is in the cache of these kernel sources (``datapath.jit``), where
appliances and clients load it at start (``datapath.jit.preload``). The record ``warm.json``
beside it makes a second run a no-op until a kernel source changes (``--force`` runs it
anyway).
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

from datapath import jit
from datapath.errors import UserError

WARM_TIMEOUT_S = float(os.environ.get("TOPICWIRE_WARM_TIMEOUT_S", "300"))
"""Longest the warm-up fabric may take to converge or to deliver a round (a cold cache
compiles everything on the way, on a 2-core host for a few minutes). The image build's
warm-up (docs/images.md) sets ``TOPICWIRE_WARM_TIMEOUT_S`` longer: it compiles from nothing
inside a chroot, on a host that may be busy."""
WARM_ROUNDS = 3
"""Rounds of traffic: each registers new topics (parked at first) and repeats the old ones."""
BURST_MESSAGES = 64
"""Messages a publisher sends before one flush (a full burst)."""
BATCH_MESSAGES = 100
"""Messages of one ``publish_batch`` call per publisher and round."""
TICK_SCHEMA_ID = 9
TICK_FIELDS = [["price", 0, "u32"], ["size", 4, "u32"]]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _warm_unit_kernels() -> None:
    """The channels', codec's, RDMA, cache, ingress ACL and MQTT framing kernels' own
    warm-ups (signatures the traffic below may not reach on this host, e.g. without an RDMA
    device, a ``[cache]``, a publisher with a content ACL class or an MQTT edge)."""
    import channels
    from appliance.cache.store import warm_up as warm_cache
    from appliance.edge.mqtt import fastcodec
    from channels import _rdma_kernels
    from nic_offload.softnic import ingress_acl

    channels.warm_up()
    _rdma_kernels.warm_up()
    warm_cache()
    ingress_acl.warm_up()  # a publisher with a content ACL class
    fastcodec.warm_up()  # the MQTT edge's framing kernel (no edge runs in the traffic below)


def _multicast_ok() -> bool:
    from appliance.dataplane.open import loopback_multicast

    if loopback_multicast():
        return True
    if os.geteuid() == 0:
        import subprocess

        subprocess.run(["ip", "link", "set", "lo", "multicast", "on"], check=False,
                       capture_output=True)
    return loopback_multicast()


def _configs(multicast: bool, telemetry_dir: str) -> dict[str, dict]:
    key = secrets.token_hex(32)
    fabric = {n: _free_port() for n in ("pm", "b", "c")}
    group = f"239.255.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 1}:{_free_port()}"
    tag = secrets.token_hex(4)

    def base(name: str, pm: dict, neighbours: list[dict]) -> dict:
        return {"appliance": {"name": name, "heartbeat_interval_ms": 100,
                              "neighbour_dead_ms": 30_000,
                              # every kernel compiles in this process, which records them
                              # (a data path in a process of its own loads the same cache)
                              "dataplane": "thread",
                              # a message whose key is not known yet waits as long as a cold
                              # cache may take to compile on a busy host (not 2 s)
                              "parked_ttl_ms": int(min(WARM_TIMEOUT_S, 600) * 1000)},
                "fabric": {"listen": f"127.0.0.1:{fabric[name]}", "key": key},
                "neighbours": neighbours,
                "clients": {"udp": f"127.0.0.1:{_free_port()}", "shm": f"twwarm-{tag}-{name}",
                            "session_dead_ms": 60_000},
                "telemetry": {"dir": f"{telemetry_dir}/{name}", "window_ms": 100,
                              "probe_interval_ms": 20},
                "pm": pm}

    def nb(name: str, grouped: bool = False) -> dict:
        out = {"name": name, "address": f"127.0.0.1:{fabric[name]}"}
        if grouped:
            out["group"] = "cores"
        return out

    pm_doc = {"mode": "embedded", "require_passwords": False,  # its own clients, on loopback
              "identities": {"warm": {"publish": ["#"], "subscribe": ["#"]}},
              "schemas": {"tick": {"id": TICK_SCHEMA_ID, "fields": TICK_FIELDS}}}
    out = {"pm": base("pm", pm_doc, [nb("b")]),
           "b": base("b", {"mode": "remote"}, [nb("pm"), nb("c", multicast)]),
           "c": base("c", {"mode": "remote"}, [nb("b", multicast)])}
    if multicast:
        for name in ("b", "c"):
            out[name]["fabric"]["groups"] = [{"name": "cores", "address": group,
                                              "interface": "127.0.0.1", "ttl": 0}]
    return out


def _until(what: str | Callable[[], str], predicate: Callable[[], Any], deadline: float
           ) -> Any:
    """``predicate()`` once it is true; else at the deadline an error saying ``what`` (a
    callable: what it says then)."""
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise UserError(f"{said} within {WARM_TIMEOUT_S:.0f} s", component="warm")
        time.sleep(0.02)


def _retrying(action: Callable[..., Any], deadline: float, *args: Any, **kw: Any) -> Any:
    """``action(*args, **kw)``, a client request, again while a cold appliance compiles and
    does not answer yet."""
    from appliance.client import ClientError

    while True:
        try:
            return action(*args, **kw)
        except ClientError:
            if time.monotonic() > deadline:
                raise


def _traffic(appliances: dict[str, Any], configs: dict[str, dict], deadline: float) -> int:
    """Every kind of traffic through the fabric; returns the messages delivered."""
    import struct

    import numpy as np

    from appliance.client import connect

    def udp(name: str) -> str:
        return f"udp://{configs[name]['clients']['udp']}"

    def shm(name: str) -> str:
        return f"shm://{configs[name]['clients']['shm']}"

    clients: list[Any] = []

    def client(url: str) -> Any:
        c = _retrying(connect, deadline, url, "warm", timeout_s=30.0)
        clients.append(c)
        return c

    try:
        subs = {  # (client, subscription, expected per round)
            "c-udp": client(udp("c")), "c-shm": client(shm("c")), "b-shm": client(shm("b")),
            "pm-udp": client(udp("pm"))}
        best = {n: _retrying(c.subscribe, deadline, "w/#") for n, c in subs.items()}
        guaranteed = _retrying(subs["c-udp"].subscribe, deadline, "g/#", qos="guaranteed")
        gshm = _retrying(subs["c-shm"].subscribe, deadline, "g/#", qos="guaranteed")
        selected = _retrying(subs["c-udp"].subscribe, deadline, "s/#", selector="price > 10")
        pollers = [client(udp("c")), client(shm("c"))]  # Client.poll's decoding
        for poller in pollers:
            _retrying(poller.subscribe, deadline, "w/#", poll=True)
        pubs = [client(udp("b")), client(udp("b")), client(udp("b")), client(shm("b")),
                client(udp("pm"))]
        tick = struct.Struct(">II")
        delivered = 0
        for rnd in range(1, WARM_ROUNDS + 1):
            want = {n: 0 for n in best}
            gwant = sselected = 0
            for i, pub in enumerate(pubs):
                for topic in (f"w/{i}/old", f"w/{i}/new{rnd}"):  # new: parked, then rerun
                    for k in range(BURST_MESSAGES):  # one burst, then one flush
                        _retrying(pub.publish, deadline, topic, b"x" * (k % 40))
                    _retrying(pub.flush, deadline)
                    _retrying(pub.publish, deadline, topic, b"one", flush=True)
                    for n in want:
                        want[n] += BURST_MESSAGES + 1
                for k in range(8):
                    _retrying(pub.publish, deadline, f"g/{i}/{rnd}", b"g%d" % k,
                              qos="guaranteed", flush=True)
                    gwant += 1
                # publish_batch's packing, with a list and with a 2-D array of payloads
                rows = np.full((BATCH_MESSAGES, 16), i, np.uint8) if i % 2 else [
                    b"b" * (k % 40) for k in range(BATCH_MESSAGES)]
                _retrying(pub.publish_batch, deadline, f"w/{i}/batch", rows)
                for n in want:
                    want[n] += BATCH_MESSAGES
                for price in (5, 50):
                    _retrying(pub.publish, deadline, f"s/{i}", tick.pack(price, 1),
                              schema_id=TICK_SCHEMA_ID, flush=True)
                sselected += 1
            got = {n: 0 for n in best}
            counts = {"g": 0, "gshm": 0, "s": 0}
            polled = [0] * len(pollers)

            def drained(got: dict = got, counts: dict = counts, want: dict = want,
                        gwant: int = gwant, sselected: int = sselected,
                        polled: list = polled) -> bool:
                for n, sub in best.items():
                    while sub.get(timeout=0) is not None:
                        got[n] += 1
                for j, poller in enumerate(pollers):
                    polled[j] += poller.poll(_read_view)
                for name, sub in (("g", guaranteed), ("gshm", gshm), ("s", selected)):
                    while sub.get(timeout=0) is not None:
                        counts[name] += 1
                return (all(got[n] >= want[n] for n in want) and counts["g"] >= gwant
                        and counts["gshm"] >= gwant and counts["s"] >= sselected
                        and all(p >= want["c-udp"] for p in polled))

            _until(lambda rnd=rnd, got=got, counts=counts, want=want, gwant=gwant,
                   sselected=sselected, polled=polled: f"round {rnd}'s messages did not all "
                   f"arrive (got {got}, {counts}, polled {polled}; wanted {want}, {gwant} "
                   f"guaranteed, {sselected} selected; {_losses(subs, appliances)})", drained,
                   deadline)
            delivered += sum(got.values()) + sum(counts.values()) + sum(polled)
        return delivered
    finally:
        for c in clients:
            c.close()


def _read_view(view: Any) -> None:
    """A poll handler that reads what an application would (the view's fields)."""
    view.sequence, view.topic, view.latency_ns, len(view.payload)


def _losses(clients: dict[str, Any], appliances: dict[str, Any]) -> str:
    """Where messages were dropped, for a round that fell short: each UDP subscriber's socket
    (the kernel's ``drops`` in /proc/net/udp: its buffer was full), each subscriber's messages
    received against those its appliance counted delivered to it, and each appliance's
    non-zero drop counters."""
    out = []
    try:
        with open("/proc/net/udp") as f:
            rows = {parts[1]: int(parts[12]) for parts in map(str.split, f)
                    if len(parts) > 12 and parts[12].isdigit()}
    except OSError:
        rows = {}
    statuses = {name: appliance.status() for name, appliance in appliances.items()}
    delivered = {c["session"]: c.get("delivered", 0) for status in statuses.values()
                 for c in status.get("clients", ())}
    for name, client in clients.items():
        if client.session in delivered:  # sent by its appliance, not received: lost between
            out.append(f"{name} received {client.received} of the {delivered[client.session]} "
                       "its appliance delivered")
        address = getattr(client.channel, "local_address", None)
        if address and rows:
            local = f"0100007F:{address[1]:04X}"
            out.append(f"{name} socket drops {rows.get(local, '?')}")
        refused = {k: v for k, v in client.refused_by_reason.items() if v}
        if refused:
            out.append(f"{name} refused frames {refused}")
        pending = sum(map(len, list(client._pending.values())))
        if pending:  # messages of topic keys it could not name yet (asked with RESOLVE)
            out.append(f"{name} holds {pending} messages of {len(client._pending)} unnamed "
                       "topic keys")
    for name, status in statuses.items():
        counters = {**status.get("counters", {}), **{
            k: v for k, v in status.get("offload", {}).items() if isinstance(v, int)}}
        dropped = {k: v for k, v in counters.items() if v and any(
            w in k for w in ("drop", "parked_expired", "unroutable", "no_port", "full", "selector",
                             "backpressure", "lost"))}
        out.append(f"{name}: {dropped or 'no drops counted'}")
    return "; ".join(out)


RUN_DEPENDENT = ("seconds", "delivered")
"""Fields of ``warm.json`` that differ from run to run (left out with ``--reproducible``)."""


def _reorder(record: dict[str, Any], say: Callable[[str], None]) -> None:
    """The cache compiled again in a fixed order (warm_order.py); noted in ``record``."""
    from appliance.ops.warm_order import recompile_in_order

    started = time.monotonic()
    say("warm: compiling the cache again in a fixed order (--reproducible)")
    record["reproducible"] = recompile_in_order(jit.cache_dir())
    say(f"warm: compiled {record['reproducible']} signatures again in "
        f"{time.monotonic() - started:.1f} s")
    for key in RUN_DEPENDENT:  # warm.json is one of the cache's files: the same bytes too
        record.pop(key, None)


def run_warm(force: bool = False, say: Callable[[str], None] = print,
             reproducible: bool = False) -> dict[str, Any]:
    """Warm the cache of the current kernel sources (a no-op when done, unless ``force``);
    returns the record written to ``warm.json``. ``reproducible``: then compile the cache
    again in a fixed order (warm_order.py), also when it was warm already."""
    if not force and jit.warmed():
        record = dict(jit.warm_record() or {})
        if reproducible and not record.get("reproducible"):
            _reorder(record, say)
            jit.write_warm_record(record)
        record["skipped"] = True
        return record
    started = time.monotonic()
    say(f"warm: compiling the kernels into {jit.cache_dir()} (a cold cache takes a few "
        "minutes)")
    _warm_unit_kernels()
    from appliance.config import parse_config
    from appliance.node import Appliance

    multicast = _multicast_ok()
    scratch = tempfile.TemporaryDirectory(prefix="topicwire-warm-")
    configs = _configs(multicast, scratch.name)
    deadline = time.monotonic() + WARM_TIMEOUT_S
    appliances: dict[str, Any] = {}
    try:
        for name in ("pm", "b", "c"):
            appliances[name] = Appliance(parse_config(configs[name])).start()
        _until("the three appliances did not converge", lambda: (
            len(appliances["pm"].status().get("routes", ())) >= 3
            and all(appliances[n].status().get("node", {}).get("pm") for n in ("b", "c"))),
            deadline)
        say("warm: fabric up; running traffic")
        delivered = _traffic(appliances, configs, deadline)
    finally:
        for appliance in reversed(list(appliances.values())):
            appliance.stop()
        scratch.cleanup()
    removed = jit.prune_other_digests()
    record = {"seconds": round(time.monotonic() - started, 1), "multicast": multicast,
              "delivered": delivered, "signatures": jit.signatures(),
              "pruned": [p.name for p in removed]}
    if reproducible:
        _reorder(record, say)
    jit.write_warm_record(record)
    say(f"warm: done in {time.monotonic() - started:.1f} s "
        f"({sum(map(len, record['signatures'].values()))} "
        f"signatures of {len(record['signatures'])} kernels)")
    return record
