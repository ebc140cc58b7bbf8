"""Clients that know where they stand: each guaranteed message's outcome, ``flush`` and
``close`` that report what the appliance did not acknowledge, and a connection that notices a
lost appliance, says so, reconnects, logs in again and subscribes again (and, with
``resend=True``, sends the unacknowledged guaranteed messages again).

Real appliances: ``topicwire run`` processes killed with SIGKILL (no logout, no goodbye) and
started again on the same address; in-process ones where nothing is killed. Every wait has a
deadline and waits for an event or a counter; nothing is proven by sleeping.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest

from appliance.client import (
    ClientError,
    ConnectionLostError,
    PublishFailedError,
    StateChange,
    UnacknowledgedError,
    connect,
)
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import CLI, ROOT, free_port, run_appliance, start, stop, wait_for

SESSION_TIMEOUT_S = 1.0
"""The clients' session timeout in these tests (short: the tests wait for it)."""
DEADLINE_S = 60.0
"""Every wait's deadline (generous: processes start and kernels load on a shared host)."""
CONFIG = """
[appliance]
name = "st{port}"
[clients]
udp = "127.0.0.1:{port}"
[pm]
anonymous = true
require_passwords = false
"""


class States:
    """An ``on_state`` callback that records the changes and lets a test wait for one."""

    def __init__(self) -> None:
        self.changes: list[StateChange] = []
        self.cond = threading.Condition()

    def __call__(self, change: StateChange) -> None:
        with self.cond:
            self.changes.append(change)
            self.cond.notify_all()

    def wait(self, state: str, count: int = 1, timeout_s: float = DEADLINE_S) -> StateChange:
        """The ``count``-th change to ``state`` (waiting for it)."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                seen = [c for c in self.changes if c.state == state]
                if len(seen) >= count:
                    return seen[count - 1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no change to {state!r} within {timeout_s} s: "
                                         f"{[c.state for c in self.changes]}")
                self.cond.wait(left)

    @property
    def names(self) -> list[str]:
        with self.cond:
            return [c.state for c in self.changes]


@pytest.fixture
def process(tmp_path):
    """A ``topicwire run`` appliance process; ``restart()`` starts it again on its address."""

    class Node:
        def __init__(self) -> None:
            self.port = free_port()
            self.config = tmp_path / "a.toml"
            self.config.write_text(CONFIG.format(port=self.port))
            self.url = f"udp://127.0.0.1:{self.port}"
            self.address = f"127.0.0.1:{self.port}"
            self.proc = run_appliance(self.config)

        def kill(self) -> None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(DEADLINE_S)

        def restart(self) -> None:
            self.proc = run_appliance(self.config)

    node = Node()
    yield node
    stop(node.proc)


@pytest.fixture
def appliance():
    port = free_port()
    cfg = parse_config({"appliance": {"name": f"cs{port}"}, "clients": {"udp": f"127.0.0.1:{port}"},
                        "pm": {"anonymous": True, "require_passwords": False}})
    app = Appliance(cfg).start()
    yield f"udp://127.0.0.1:{port}"
    app.stop()


# --- outcomes, flush, close ----------
def test_every_guaranteed_outcome_is_acknowledged_and_flush_with_a_timeout_passes(appliance):
    called = []
    with connect(appliance, "p") as pub:
        outcomes = [pub.publish("g/a", b"%d" % i, qos="guaranteed", on_outcome=called.append)
                    for i in range(300)]
        pub.flush(timeout=DEADLINE_S)  # raises if any was not acknowledged
        assert all(o.acknowledged for o in outcomes)
        assert [o.result(timeout=0) for o in outcomes] == [o.sequence for o in outcomes]
        assert [o.sequence for o in outcomes] == list(range(1, 301))
        wait_for(lambda: len(called) == 300)
        assert pub.unacknowledged == 0
        assert pub.connection_counters()["acknowledged"] == 300
    assert pub.close() == 0


def test_bad_arguments_are_client_errors_naming_what_to_give(appliance):
    with pytest.raises(ClientError, match="session_timeout_s must be a number of seconds"):
        connect(appliance, session_timeout_s=-1)
    with pytest.raises(ClientError, match="reconnect_s must be a number of seconds"):
        connect(appliance, reconnect_s="forever")
    with connect(appliance, "p") as client:
        with pytest.raises(ClientError, match="on_outcome is a callable, and only for"):
            client.publish("t/a", b"x", on_outcome=print)
        with pytest.raises(ClientError, match="flush.timeout=. takes seconds"):
            client.flush(timeout=-1)
        with pytest.raises(ClientError, match="on_state must be a callable"):
            connect(appliance, on_state="print")


def test_a_killed_appliance_fails_the_outcomes_and_flush_raises_with_the_count(process):
    states = States()
    # a session timeout long enough for the 40 publishes after the kill to go before it ends
    pub = connect(process.url, "p", on_state=states, session_timeout_s=3 * SESSION_TIMEOUT_S,
                  reconnect_s=0)
    try:
        before = [pub.publish("g/a", b"before", qos="guaranteed") for _ in range(50)]
        pub.flush(timeout=DEADLINE_S)
        assert all(o.acknowledged for o in before)
        process.kill()
        after = [pub.publish("g/a", b"after", qos="guaranteed") for _ in range(40)]
        pub.flush()  # sent, to nobody; nothing has failed yet
        lost = states.wait("lost")
        assert lost.failed == 40
        assert all(o.done() and not o.acknowledged for o in after)
        with pytest.raises(PublishFailedError, match="appliance lost") as failed:
            after[0].result(timeout=0)
        assert failed.value.reason.startswith("appliance lost")
        with pytest.raises(UnacknowledgedError, match="40 guaranteed messages not "
                           "acknowledged") as raised:
            pub.flush(timeout=1.0)
        assert raised.value.count == raised.value.failed == 40
        states.wait("closed")  # reconnect_s=0: it gives up at once
        with pytest.raises(ConnectionLostError, match="closed"):
            pub.publish("g/a", b"x", qos="guaranteed")
    finally:
        assert pub.close() == 0  # all of them reported by flush already
    assert states.names == ["lost", "closed"]


def test_close_fails_and_returns_what_the_appliance_did_not_acknowledge(process):
    pub = connect(process.url, "p", session_timeout_s=60.0)  # close comes before the timeout
    pub.publish("g/a", b"registered", qos="guaranteed")
    pub.flush(timeout=DEADLINE_S)
    process.kill()
    outcomes = [pub.publish("g/a", b"x", qos="guaranteed") for _ in range(25)]
    assert pub.close() == 25
    assert pub.close_failures == {"session closed": 25}
    assert all(o.exception(timeout=0).reason == "session closed" for o in outcomes)


def test_with_resend_the_unacknowledged_messages_go_again_on_the_new_session(process):
    states = States()
    pub = connect(process.url, "p", on_state=states, session_timeout_s=3 * SESSION_TIMEOUT_S,
                  resend=True)
    try:
        pub.publish("g/a", b"before", qos="guaranteed")
        pub.flush(timeout=DEADLINE_S)
        process.kill()
        outcomes = [pub.publish("g/a", b"%d" % i, qos="guaranteed") for i in range(30)]
        pub.flush()
        assert states.wait("lost").failed == 0  # kept, not failed
        assert pub.unacknowledged == 30 and not any(o.done() for o in outcomes)
        process.restart()
        states.wait("reconnected")
        with pytest.raises(ConnectionLostError, match="the guaranteed ones were sent again"):
            pub.flush(timeout=DEADLINE_S)  # waits for them, then reports the loss once
        pub.flush(timeout=DEADLINE_S)  # raises if any was not acknowledged
        assert all(o.acknowledged for o in outcomes) and pub.resent == 30
        assert [o.sequence for o in outcomes] == list(range(1, 31))  # the new stream's
    finally:
        assert pub.close() == 0


def test_with_resend_close_fails_what_waits_to_go_again(process):
    states = States()
    pub = connect(process.url, "p", on_state=states, session_timeout_s=SESSION_TIMEOUT_S,
                  resend=True)
    pub.publish("g/a", b"before", qos="guaranteed")
    pub.flush(timeout=DEADLINE_S)
    process.kill()
    outcomes = [pub.publish("g/a", b"x", qos="guaranteed") for _ in range(5)]
    states.wait("lost")
    assert pub.close() == 5 and pub.close_failures == {"session closed": 5}
    assert all(o.exception(timeout=0).reason == "session closed" for o in outcomes)


# --- lost and found ----------
def test_a_subscriber_notices_a_killed_appliance_then_reconnects_and_subscribes_again(process):
    states = States()
    losses = []
    sub_client = connect(process.url, "s", on_state=states, session_timeout_s=SESSION_TIMEOUT_S)
    try:
        plain = sub_client.subscribe("t/#")
        guaranteed = sub_client.subscribe("g/#", qos="guaranteed", on_loss=losses.append)
        sub_client.unsubscribe("t/quiet/#")  # a partial unsubscribe, replayed as well
        with connect(process.url, "p") as pub:
            pub.publish("t/a", b"one", flush=True)
            pub.publish("g/a", b"one", qos="guaranteed", flush=True)
            assert plain.get(timeout=DEADLINE_S).payload == b"one"
            assert guaranteed.get(timeout=DEADLINE_S).payload == b"one"
        first_session = sub_client.session
        process.kill()
        lost = states.wait("lost")  # within the session timeout: nothing else tells it
        assert "no answer from the appliance" in lost.reason
        wait_for(lambda: losses)
        assert losses[0].reason == "SESSION_LOST"
        with pytest.raises(ConnectionLostError, match="connection to the appliance was lost"):
            sub_client.subscribe("x/#")
        process.restart()
        states.wait("reconnected")
        assert sub_client.state == "connected" and sub_client.session != first_session
        assert sub_client.reconnects == 1
        with connect(process.url, "p2") as pub:
            received = sub_client.received
            pub.publish("t/quiet/a", b"withheld", flush=True)
            pub.publish("t/a", b"two", flush=True)
            pub.publish("g/a", b"two", qos="guaranteed")
            pub.flush(timeout=DEADLINE_S)
            assert plain.get(timeout=DEADLINE_S).payload == b"two"
            assert guaranteed.get(timeout=DEADLINE_S).payload == b"two"
            # the appliance withheld t/quiet/a: the partial unsubscribe was made again there
            # (the client's own list would have withheld it from the subscription anyway)
            assert sub_client.received == received + 2
        sub_client.subscribe("x/#")  # usable again: the loss was reported once
    finally:
        sub_client.close()
    names = states.names
    assert names[0] == "lost" and "reconnecting" in names
    assert names[-2:] == ["reconnected", "closed"]


def test_many_subscriptions_and_a_list_s_order_are_made_again_after_a_restart(process):
    """The (un)subscribes of a reconnection go in batched requests, a run at a time in the
    list's order: 600 one-topic subscriptions, then a broad one, a carve-out and a topic
    taken back; afterwards each decides as before."""
    states = States()
    sub_client = connect(process.url, "s", on_state=states, session_timeout_s=SESSION_TIMEOUT_S)
    try:
        topics = [f"m/{i}" for i in range(600)]
        made = sub_client.subscribe_many(topics)
        assert all(not isinstance(s, Exception) for s in made)
        broad = sub_client.subscribe("n/#")
        sub_client.unsubscribe("n/q/#")
        back = sub_client.subscribe("n/q/keep")
        process.kill()
        states.wait("lost")
        process.restart()
        states.wait("reconnected")
        with connect(process.url, "p") as pub:
            for topic in ("n/q/x", "n/q/keep", "m/599", "n/a", "n/z"):
                pub.publish(topic, topic.encode(), flush=True)
        seen = set()
        while "n/z" not in seen:  # the last: what came before it is there by now
            msg = broad.get(timeout=DEADLINE_S)
            assert msg is not None, f"n/z did not come; seen {seen}"
            seen.add(msg.topic)
        for sub in (broad, back, made[599]):
            while (msg := sub.get(timeout=0.001)) is not None:
                seen.add(msg.topic)
        assert "n/q/x" not in seen  # the carve-out was made again after the broad one
        assert {"n/q/keep", "m/599", "n/a", "n/z"} <= seen
    finally:
        sub_client.close()


def test_an_appliance_restarted_within_the_timeout_is_noticed_by_its_answer(process):
    """The appliance is back before the session timeout: the client's probe reaches the new
    one, which does not know the session; the client reconnects at once."""
    states = States()
    client = connect(process.url, "s", on_state=states, session_timeout_s=600.0)
    try:
        sub = client.subscribe("t/#")
        process.kill()
        process.restart()
        lost = states.wait("lost")
        assert "no longer knows this session" in lost.reason or "refused" in lost.reason
        states.wait("reconnected")
        with connect(process.url, "p") as pub:
            pub.publish("t/a", b"after", flush=True)
            assert sub.get(timeout=DEADLINE_S).payload == b"after"
    finally:
        client.close()


def test_a_shared_memory_client_reconnects_on_a_new_bus_after_a_restart(tmp_path):
    """A restarted appliance makes its shared-memory bus anew: the client opens a new ring
    and producer slot on it and logs in again."""
    name = f"st-shm-{free_port()}"
    config = tmp_path / "shm.toml"
    config.write_text(f'[appliance]\nname = "{name}"\n[clients]\nshm = "{name}"\n'
                      "[pm]\nanonymous = true\nrequire_passwords = false\n")
    proc = run_appliance(config)
    states = States()
    client = None
    try:
        client = connect(f"shm://{name}", "s", on_state=states,
                         session_timeout_s=SESSION_TIMEOUT_S)
        sub = client.subscribe("t/#")
        old_channel = client.channel
        proc.send_signal(signal.SIGKILL)
        proc.wait(DEADLINE_S)
        states.wait("lost")
        proc = run_appliance(config)
        states.wait("reconnected")
        assert client.channel is not old_channel and old_channel.closed
        with connect(f"shm://{name}", "p") as pub:
            pub.publish("t/shm", b"back", flush=True)
            assert sub.get(timeout=DEADLINE_S).payload == b"back"
    finally:
        if client is not None:
            client.close()
        stop(proc)


# --- the command line ----------
class Command:
    """A ``topicwire`` process whose stderr a thread reads line by line (so the process
    never blocks on a full pipe, and a test waits for a line with a deadline)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = start(argv)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_line(self, needle: str, timeout_s: float = DEADLINE_S) -> str:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or not self.thread.is_alive():
                    raise AssertionError(f"no stderr line with {needle!r} within {timeout_s} "
                                         f"s: {self.lines}")
                self.cond.wait(min(left, 0.5))

    def finish(self, timeout_s: float = DEADLINE_S) -> tuple[int, str, str]:
        """Exit code, stdout, stderr (waiting for the exit)."""
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        code = self.proc.wait(timeout_s)
        self.thread.join(timeout_s)
        return code, out, "".join(self.lines)


def test_topicwire_pub_says_how_many_were_not_acknowledged_and_exits_non_zero(process):
    received = threading.Event()
    with connect(process.url, "watch") as watcher:
        watcher.subscribe("g/cli", callback=lambda m: received.set(), qos="guaranteed")
        pub = Command([*CLI, "pub", "--appliance", process.address, "--topic", "g/cli",
                       "--qos", "guaranteed", "--count", "1500", "--rate", "500", "--json",
                       "--session-timeout", str(SESSION_TIMEOUT_S), "--reconnect", "60"])
        assert received.wait(DEADLINE_S), "no message of pub reached the watcher"
    process.kill()  # mid-stream
    pub.wait_line("pub: connection to")  # ... lost: it says so
    process.restart()
    pub.wait_line("pub: reconnected")
    code, out, err = pub.finish()
    assert code == 1, err
    summary = json.loads(out)
    assert summary["sent"] == 1500 and summary["reconnects"] == 1
    assert summary["unacknowledged"] >= 1  # those published into the dead appliance
    assert summary["acknowledged"] + summary["unacknowledged"] == summary["sent"]
    assert sum(summary["failed_reasons"].values()) == summary["unacknowledged"]
    assert f"{summary['unacknowledged']} of 1500 guaranteed messages were not acknowledged" in err


def test_topicwire_sub_says_it_lost_the_appliance_and_receives_again_after_it_returns(process):
    sub = Command([*CLI, "sub", "--appliance", process.address, "t/#", "--count", "1",
                   "--seconds", str(DEADLINE_S), "--session-timeout", str(SESSION_TIMEOUT_S)])
    try:
        sub.wait_line("subscribed")
        process.kill()
        sub.wait_line("sub: connection to")
        assert "lost: no answer from the appliance" in sub.wait_line("sub: connection to")
        process.restart()
        sub.wait_line("subscribed to t/# again")
        with connect(process.url, "p") as pub:
            pub.publish("t/back", b"again", flush=True)
        code, out, err = sub.finish()
    finally:
        stop(sub.proc)
    assert code == 0, err
    assert out == "t/back again\n", err


def test_topicwire_sub_exits_non_zero_when_it_gives_up(process):
    sub = Command([*CLI, "sub", "--appliance", process.address, "t/#", "--stats",
                   "--session-timeout", str(SESSION_TIMEOUT_S), "--reconnect", "0.5"])
    try:
        sub.wait_line("subscribed")
        process.kill()
        code, out, err = sub.finish()
    finally:
        stop(sub.proc)
    assert code == 1, err
    assert "gave up reconnecting" in err and "exiting after 0 messages" in err
    stats = json.loads(out)
    assert stats["connection_losses"] == 1 and "gave up reconnecting" in stats["gave_up"]


def test_topicwire_sub_says_which_signal_stopped_it(process):
    sub = Command([*CLI, "sub", "--appliance", process.address, "t/#"])
    try:
        sub.wait_line("subscribed")
        sub.proc.send_signal(signal.SIGTERM)
        code, _, err = sub.finish()
    finally:
        stop(sub.proc)
    assert code == 0
    assert "stopping (SIGTERM) after 0 messages" in err


@pytest.mark.parametrize("command,option,value", [("sub", "--session-timeout", "-1"),
                                                  ("pub", "--reconnect", "nan")])
def test_bad_connection_options_are_refused_naming_the_option(command, option, value):
    args = ["x/#"] if command == "sub" else ["--topic", "x"]
    done = subprocess.run([*CLI, command, "--appliance", "127.0.0.1:1", *args, option, value],
                          cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 2
    assert f"topicwire: {command}: {option} must be a number of seconds" in done.stderr
