"""bench.procstat: CPU time from /proc, an appliance's counting its data path's process (a
fork with the same command line) and not another program it started."""

import os
import subprocess
import sys
import time

from bench.procstat import appliance_cpu_seconds, cpu_seconds, forked_children
from tests.appliance.helpers import wait_for


def test_cpu_seconds_reads_this_process():
    spent = cpu_seconds(os.getpid())
    sum(range(2_000_000))  # some work of our own
    assert cpu_seconds(os.getpid()) > spent


def test_an_appliances_cpu_counts_its_forked_child_and_not_another_program():
    """A process that forks a busy child (as an appliance forks its data path) from a thread,
    and starts a program of another command line (as its management API)."""
    script = ("import os, subprocess, sys, threading, time\n"
              "other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              "def fork():\n"
              "    if os.fork() == 0:\n"
              "        end = time.monotonic() + 60\n"
              "        while time.monotonic() < end: pass\n"
              "        os._exit(0)\n"
              "threading.Thread(target=fork).start()\n"
              "print(other.pid, flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    other = None
    try:
        other = int(proc.stdout.readline())
        children = wait_for(lambda: forked_children(proc.pid), what="the forked child")
        assert len(children) == 1 and other not in children
        own, started = cpu_seconds(proc.pid), time.monotonic()
        total = appliance_cpu_seconds(proc.pid)
        wait_for(lambda: appliance_cpu_seconds(proc.pid) > total + 0.1,
                 what="the busy child's CPU counted")
        assert cpu_seconds(proc.pid) - own < 0.1 + (time.monotonic() - started) * 0.1
    finally:
        for child in forked_children(proc.pid):
            os.kill(child, 9)
        if other is not None:
            os.kill(other, 9)
        proc.kill()
        proc.wait()
