"""PollingIdle parks in poll(2): a datagram or an offered command ends the park; a source
without a descriptor keeps the parks short (bounded sleeps) until the longest park."""

import threading

import pytest

from channels.base import FrameBatch
from channels.shm import ShmChannel
from channels.tcp import TcpChannel
from channels.udp import UdpChannel
from datapath.agent import AgentRunner, AgentWakeup, CommandQueue, PollingIdle, WaitSet

LONG_PARK_NS = 30_000_000_000
"""A park this long ends early only when something wakes it (the tests would hang otherwise)."""


def _park_in_thread(idle: PollingIdle) -> threading.Thread:
    thread = threading.Thread(target=idle.park, daemon=True)
    thread.start()
    return thread


def _frame() -> FrameBatch:
    batch = FrameBatch(1, 64)
    batch.append(b"\x00" * 40)
    return batch


def test_a_datagram_arriving_ends_the_park_as_a_readiness_wake():
    with UdpChannel(("127.0.0.1", 0)) as rx, UdpChannel(("127.0.0.1", 0)) as tx:
        idle = PollingIdle(lambda: WaitSet(rx.wait_fds(), True), max_park_ns=LONG_PARK_NS)
        thread = _park_in_thread(idle)
        assert tx.send(_frame(), rx.local_address) == 1
        thread.join(LONG_PARK_NS / 1e9)
        assert not thread.is_alive()
        assert (idle.wakes_ready, idle.timeouts, idle.sleeps) == (1, 0, 0)
        assert rx.receive(FrameBatch(4, 64)) == 1


def test_an_offered_command_ends_the_park_and_the_signal_is_consumed():
    with AgentWakeup() as wakeup:
        queue = CommandQueue(wakeup)
        idle = PollingIdle(lambda: WaitSet((), True), wakeup, max_park_ns=LONG_PARK_NS)
        thread = _park_in_thread(idle)
        queue.offer(lambda: None)
        thread.join(LONG_PARK_NS / 1e9)
        assert not thread.is_alive()
        assert (idle.wakes_command, idle.wakes_ready, idle.timeouts) == (1, 0, 0)
        short = PollingIdle(lambda: WaitSet((), True), wakeup, max_park_ns=1_000_000)
        short.park()  # nothing pending any more: this park runs to its end
        assert (short.timeouts, short.wakes_command) == (1, 0)
        assert len(queue) == 1


def test_without_a_descriptor_the_parks_are_bounded_sleeps_until_the_longest_park():
    idle = PollingIdle(lambda: WaitSet((), False), max_park_ns=8_000)
    for _ in range(3):  # 1, 2, 4 us: slept, never blocked in poll
        idle.park()
    assert (idle.sleeps, idle.timeouts) == (3, 0)
    idle.park()  # the longest park is spent in poll, where descriptors would wake it
    assert (idle.sleeps, idle.timeouts) == (3, 1)


def test_a_datagram_wakes_the_longest_park_even_beside_a_source_without_a_descriptor():
    with UdpChannel(("127.0.0.1", 0)) as rx, UdpChannel(("127.0.0.1", 0)) as tx:
        idle = PollingIdle(lambda: WaitSet(rx.wait_fds(), False), max_park_ns=LONG_PARK_NS)
        idle._park_ns = LONG_PARK_NS  # as after the growing sleeps
        thread = _park_in_thread(idle)
        tx.send(_frame(), rx.local_address)
        thread.join(LONG_PARK_NS / 1e9)
        assert not thread.is_alive() and idle.wakes_ready == 1 and idle.sleeps == 0


def test_the_agent_spins_for_its_spin_window_after_work_then_parks():
    spinning = PollingIdle(lambda: WaitSet((), False), spin_ns=LONG_PARK_NS, max_park_ns=4_000)
    for _ in range(100):
        spinning.idle(0)
    assert spinning.sleeps == 0 and spinning.timeouts == 0  # still inside its window
    eager = PollingIdle(lambda: WaitSet((), False), spin_ns=0, max_park_ns=4_000)
    eager.idle(0)
    assert eager.sleeps == 1  # no window: parks at the first idle cycle
    short = PollingIdle(lambda: WaitSet((), False), spin_ns=1, max_park_ns=4_000)
    for _ in range(1_000):  # a 1 ns window ends after a cycle or two
        short.idle(0)
        if short.sleeps:
            break
    assert short.sleeps == 1
    short.idle(3)  # work opens a new window
    short.idle(0)
    assert short.sleeps == 1


def test_after_work_that_was_no_data_the_agent_parks_without_spinning():
    worth = [False]
    idle = PollingIdle(lambda: WaitSet((), False), spin_ns=LONG_PARK_NS, max_park_ns=4_000,
                       spin_worth=lambda: worth[0])
    idle.idle(1)  # a heartbeat's cycle
    idle.idle(0)
    assert idle.sleeps == 1 and idle.skipped_spins == 1  # parked at the first idle cycle
    worth[0] = True  # a data burst's cycle
    idle.idle(1)
    for _ in range(100):
        idle.idle(0)
    assert idle.sleeps == 1 and idle.skipped_spins == 1  # spinning in its window


def test_channels_say_which_descriptors_signal_their_frames():
    with UdpChannel(("127.0.0.1", 0)) as udp:
        assert udp.wait_fds() == (udp.fileno(),)
    assert udp.wait_fds() is None  # closed
    with TcpChannel(listen=("127.0.0.1", 0)) as server:
        with TcpChannel(connect=server.local_address) as client:
            assert client.wait_fds() and len(client.wait_fds()) == 1
            batch = FrameBatch(4, 64)
            for _ in range(1_000):  # accept the connection
                server.receive(batch)
                if server.peers():
                    break
            assert len(server.wait_fds()) == 1 + len(server.peers()) == 2
    ring = f"tw-poll-test-{threading.get_ident()}"
    with ShmChannel(rx=ring, producers=1) as shm:  # its doorbell (channels/shm.py)
        assert shm.wait_fds() == (shm._bell,)
        with ShmChannel(tx=ring) as producer:  # nothing to receive: nothing to wait on
            assert producer.wait_fds() is None
    assert shm.wait_fds() is None  # closed


class _UdpReader:
    """An agent that counts the frames of one UDP channel and runs commands."""

    name = "udp-reader"

    def __init__(self, channel: UdpChannel, wakeup: AgentWakeup) -> None:
        self.channel = channel
        self.batch = FrameBatch(8, 64)
        self.commands = CommandQueue(wakeup)
        self.frames = 0

    def do_work(self, now_ns: int) -> int:
        n = self.channel.receive(self.batch)
        self.frames += n
        return n + self.commands.drain()

    def on_close(self) -> None:
        return None


def test_a_runner_parked_in_poll_receives_a_datagram_runs_a_command_and_stops_at_once():
    with UdpChannel(("127.0.0.1", 0)) as rx, UdpChannel(("127.0.0.1", 0)) as tx, \
            AgentWakeup() as wakeup:
        agent = _UdpReader(rx, wakeup)
        idle = PollingIdle(lambda: WaitSet(rx.wait_fds(), True), wakeup, spin_ns=0,
                           max_park_ns=LONG_PARK_NS)
        ran = threading.Event()
        runner = AgentRunner([agent], idle).start()
        try:
            pause = threading.Event()
            while idle.polls == 0 and not pause.wait(0.001):
                pass  # until the runner has gone to poll (for 30 s)
            tx.send(_frame(), rx.local_address)
            while agent.frames == 0 and not pause.wait(0.001):
                pass  # only the datagram's readiness can end the park this soon
            assert agent.frames == 1 and idle.wakes_ready >= 1
            agent.commands.offer(ran.set)
            assert ran.wait(LONG_PARK_NS / 1e9) and idle.wakes_command >= 1
        finally:
            runner.stop()  # wakes the park
        assert idle.timeouts == 0 and runner.cycles >= 2


def test_the_spin_and_yield_phases_never_sleep(monkeypatch):
    """An idle cycle in a spin or yield phase hands the GIL and the CPU over without sleeping:
    time.sleep(0) is a nanosleep that the kernel's timer slack stretches to ~60 us, so a
    "spinning" agent would look for work only that often (datapath.agent.yield_cpu)."""
    from datapath import agent as agent_module
    from datapath.agent import BackoffIdle, YieldingIdle

    yields = []
    monkeypatch.setattr(agent_module.time, "sleep", lambda s: pytest.fail(f"slept {s} s"))
    monkeypatch.setattr(agent_module.os, "sched_yield", lambda: yields.append(1))
    spinning = PollingIdle(lambda: WaitSet((), True), spin_ns=LONG_PARK_NS)
    backoff = BackoffIdle(max_spins=2, max_yields=5)
    for _ in range(10):
        spinning.idle(0)
        YieldingIdle().idle(0)
    for _ in range(7):
        backoff.idle(0)
    assert len(yields) == 10 + 10 + 5 and spinning.polls == 0


def test_a_channel_closed_under_the_wait_set_is_left_out_not_a_crash():
    """A client reconnecting closes its old channel while its thread may be asking for the
    wait set: a closed descriptor reads -1 (a shared-memory channel's doorbell, seen in a
    test run under load), which poll(2) refuses; the park goes on
    with the others (here: none, so it times out)."""
    idle = PollingIdle(lambda: WaitSet((-1,), True), max_park_ns=1_000_000)
    idle.park()
    assert (idle.polls, idle.timeouts) == (1, 1)
