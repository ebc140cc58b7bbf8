"""A guaranteed publisher or subscriber client as its own process, for the fabric tests that
restart appliances under traffic (run inside a namespace, next to its appliance).

    python -m tests.fabric.gclient pub URL TOPIC COUNT RATE
    python -m tests.fabric.gclient sub URL PATTERN [STANDBY [BOUND=VALUE ...]]

Both speak JSON lines. ``pub`` logs in, then publishes guaranteed warm-up messages (payload
``w``, one every 50 ms) until a line ``go`` arrives on standard input; then COUNT messages
numbered 0..COUNT-1 (the payload is the number as text) at RATE messages per second, paced
on the clock (no drift), printing ``{"sent": n}`` every 100 messages and at the end; then it
stays logged in (its ingress appliance may still hold messages for it) until ``quit``.
``sub`` subscribes PATTERN with guaranteed QoS and prints ``{"ready": true}``, then one line
per message ``{"m": payload}`` and per loss event ``{"loss": {...}}``, in arrival order, until
its standard input closes or says ``quit``. With STANDBY (an appliance's URL) the subscriber
connects with ``standby=`` and a 1 s session timeout, and also prints each change of its
connection ``{"state": ..., "appliance": ..., "reason": ...}`` and each message's arrival
time (``t``, monotonic seconds); its ``ready`` line names the client's UDP source port
(``port``). ``BOUND=VALUE`` arguments are ``MoveBounds`` fields (``latency_ms=150``): the
session also moves when its path exceeds them; at the end (``quit``) it prints
``{"counters": connection_counters()}``; ``session_timeout_s=S`` sets the session timeout.
"""

from __future__ import annotations

import json
import select
import sys
import threading
import time
from dataclasses import asdict

from appliance.client import connect

WARM_INTERVAL_S = 0.05
PROGRESS_EVERY = 100


def _say(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _line_ready(timeout_s: float) -> str | None:
    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    return sys.stdin.readline().strip() if ready else None


def publish(url: str, topic: str, count: int, rate: float) -> int:
    with connect(url, "feed") as client:
        _say({"ready": True})
        while _line_ready(WARM_INTERVAL_S) != "go":
            client.publish(topic, b"w", qos="guaranteed", flush=True)
        start = time.monotonic()
        for i in range(count):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            client.publish(topic, str(i).encode(), qos="guaranteed", flush=True)
            if (i + 1) % PROGRESS_EVERY == 0:
                _say({"sent": i + 1})
        _say({"sent": count, "done": True, "seconds": time.monotonic() - start})
        while _line_ready(1.0) not in ("quit", ""):
            pass
    return 0


def subscribe(url: str, pattern: str, standby: str | None = None,
              bounds: dict[str, float] | None = None) -> int:
    lock = threading.Lock()

    def on_message(msg) -> None:  # an appliance.client.Message
        with lock:
            item = {"m": msg.payload.decode(errors="replace")}
            if standby:
                item["t"] = time.monotonic()
            _say(item)

    def on_loss(loss) -> None:  # an appliance.client.Loss
        with lock:
            _say({"loss": asdict(loss)})

    def on_state(change) -> None:  # an appliance.client.StateChange
        with lock:
            _say({"state": change.state, "appliance": change.appliance,
                  "reason": change.reason, "t": time.monotonic()})

    bounds = dict(bounds or {})
    timeout_s = bounds.pop("session_timeout_s", 1.0)
    extra = {"standby": standby, "session_timeout_s": timeout_s, "on_state": on_state} \
        if standby else {}
    if bounds:
        from appliance.client import MoveBounds

        extra["move_on"] = MoveBounds(**bounds)
    with connect(url, "feed", **extra) as client:
        client.subscribe(pattern, qos="guaranteed", callback=on_message, on_loss=on_loss)
        port = getattr(client.channel, "local_address", ("", 0))[1]
        _say({"ready": True, "port": port})
        while _line_ready(1.0) not in ("quit", ""):
            pass
        with lock:
            _say({"counters": client.connection_counters()})
    return 0


def main(argv: list[str]) -> int:
    if argv[0] == "pub":
        return publish(argv[1], argv[2], int(argv[3]), float(argv[4]))
    bounds = {key: float(value) for key, value in (a.split("=", 1) for a in argv[4:])}
    return subscribe(argv[1], argv[2], argv[3] if len(argv) > 3 else None, bounds)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
