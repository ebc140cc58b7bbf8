"""A publisher whose channel pushes back is slowed down, not thinned out (docs/appliance.md,
"Publishing into a channel that pushes back").

The appliance is a ``topicwire run`` process (its data path a thread of it) serving its
clients over shared memory; it is stopped with SIGSTOP so its ring from the publisher
fills. While it is stopped, a publish waits (``Client.send_waits``); resumed within
``send_wait_s``, every message arrives; kept stopped longer, the frames are dropped and
counted (``send_drops``, ``messages_dropped_at_send``), never silently.
"""

from __future__ import annotations

import signal
import threading

from appliance.client import connect
from tests.appliance.helpers import free_port, run_appliance, stop, wait_for

DEADLINE_S = 60.0
CONFIG = """
[appliance]
name = "bp{port}"
dataplane = "thread"
[clients]
udp = "127.0.0.1:{port}"
shm = "bp-{port}"
session_dead_ms = 60000
[pm]
require_passwords = false
[pm.identities.feed]
publish = ["bp/#"]
subscribe = ["bp/#"]
"""


class Served:
    def __init__(self, tmp_path) -> None:
        self.port = free_port()
        config = tmp_path / "bp.toml"
        config.write_text(CONFIG.format(port=self.port))
        self.proc = run_appliance(config)
        self.url = f"shm://bp-{self.port}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        stop(self.proc)


def _publish_until_stopped(pub, stop_flag: threading.Event, counted: list) -> None:
    n = 0
    while not stop_flag.is_set():
        pub.publish("bp/x", b"%d" % n, flush=True)
        n += 1
        counted[0] = n


def _fill_while_stopped(served, pub) -> tuple[threading.Thread, threading.Event, list]:
    """SIGSTOP the appliance and publish from a thread until a publish waits for room."""
    served.proc.send_signal(signal.SIGSTOP)
    done, counted = threading.Event(), [0]
    thread = threading.Thread(target=_publish_until_stopped, args=(pub, done, counted),
                              daemon=True)
    thread.start()
    wait_for(lambda: pub.send_waits >= 1, DEADLINE_S, what="a publish waiting for room")
    return thread, done, counted


def test_a_publisher_waits_for_a_stalled_appliance_and_loses_nothing(tmp_path):
    served = Served(tmp_path)
    try:
        with connect(served.url, "feed", session_timeout_s=60) as pub, \
                connect(served.url, "feed", session_timeout_s=60) as sub_client:
            sub = sub_client.subscribe("bp/#")
            pub.publish("bp/x", b"first", flush=True)
            assert sub.get(timeout=DEADLINE_S).payload == b"first"
            pub.send_wait_s = DEADLINE_S
            thread, done, counted = _fill_while_stopped(served, pub)
            waiting_at = counted[0]
            served.proc.send_signal(signal.SIGCONT)
            wait_for(lambda: counted[0] > waiting_at + 100, DEADLINE_S,
                     what="publishing to go on once the appliance runs again")
            done.set()
            thread.join(DEADLINE_S)
            total = counted[0]
            got = []
            while len(got) < total:
                msg = sub.get(timeout=DEADLINE_S)
                assert msg is not None, f"{len(got)} of {total} arrived; the publisher's " \
                                        f"{pub.connection_counters()}"
                got.append(msg.payload)
            assert got == [b"%d" % i for i in range(total)]
            assert pub.send_drops == 0 and pub.messages_dropped_at_send == 0
            assert pub.connection_counters()["send_waits"] >= 1
    finally:
        served.close()


def test_frames_a_stalled_appliance_never_takes_are_counted_as_dropped(tmp_path):
    served = Served(tmp_path)
    try:
        with connect(served.url, "feed", session_timeout_s=60) as pub:
            pub.publish("bp/x", b"first", flush=True)
            pub.send_wait_s = 0.05
            thread, done, counted = _fill_while_stopped(served, pub)
            wait_for(lambda: pub.send_drops >= 3, DEADLINE_S, what="frames dropped")
            done.set()
            thread.join(DEADLINE_S)
            counters = pub.connection_counters()
            served.proc.send_signal(signal.SIGCONT)
        assert counters["send_drops"] >= 3
        assert counters["messages_dropped_at_send"] == counters["send_drops"]  # one each
        assert counters["send_waits"] >= counters["send_drops"]
    finally:
        served.close()
