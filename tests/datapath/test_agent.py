"""Agents run the same way in a caller's loop or on their own thread."""

import time

import pytest

from datapath.agent import AgentRunner, BackoffIdle, CommandQueue, SleepingIdle


class Counter:
    name = "counter"

    def __init__(self, budget):
        self.budget = budget
        self.done = 0
        self.closed = 0
        self.commands = CommandQueue()

    def do_work(self, now_ns):
        work = self.commands.drain()
        if self.done < self.budget:
            self.done += 1
            work += 1
        return work

    def on_close(self):
        self.closed += 1


def test_a_runner_in_the_callers_loop_stops_when_told_and_closes_its_agents():
    agent = Counter(5)
    runner = AgentRunner([agent], SleepingIdle(1000))
    runner.run(until=lambda: agent.done == 5)
    assert agent.done == 5 and agent.closed == 1


def test_commands_reach_the_agent_inside_its_own_thread():
    agent = Counter(0)
    seen = []
    with AgentRunner([agent], BackoffIdle()).start():
        agent.commands.offer(lambda: seen.append("applied"))
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.001)
    assert seen == ["applied"] and agent.closed == 1


def test_command_drain_is_bounded_per_cycle():
    queue = CommandQueue()
    for _ in range(40):
        queue.offer(lambda: None)
    assert queue.drain(limit=16) == 16 and len(queue) == 24


def test_an_agent_failure_surfaces_when_the_runner_is_stopped():
    class Broken(Counter):
        def do_work(self, now_ns):
            raise RuntimeError("boom")

    runner = AgentRunner([Broken(0)]).start()
    deadline = time.monotonic() + 10  # the first duty cycle fails
    while runner.error is None and time.monotonic() < deadline:
        time.sleep(0.001)
    with pytest.raises(RuntimeError, match="boom"):
        runner.stop()


def test_the_start_hook_runs_first_on_the_runners_thread_and_its_failure_is_starts():
    import threading

    agent = Counter(3)
    seen = []
    runner = AgentRunner([agent], BackoffIdle(),
                         on_start=lambda: seen.append((threading.get_ident(), agent.done)))
    with runner.start():
        agent.commands.offer(lambda: seen.append((threading.get_ident(), None)))
        deadline = time.monotonic() + 10
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
    assert seen[0][1] == 0  # before the first duty cycle
    assert seen[0][0] == seen[1][0] != threading.get_ident()  # on the runner's own thread

    def refuse():
        raise PermissionError("no")

    failing = Counter(3)
    with pytest.raises(PermissionError):
        AgentRunner([failing], BackoffIdle(), on_start=refuse).start()
    assert failing.done == 0 and failing.closed == 1
