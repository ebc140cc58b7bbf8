"""The cost of the session MAC on frames between an appliance and its clients, both ways.

``python -m bench.session_mac``: one appliance (``topicwire run``, its own process, UDP on
loopback) and, in this process, two pairs of clients through the client API: a publisher and
a subscriber logged in with a password (every frame signed by its sender and checked by its
receiver: appliance/dataplane/frame_auth.py) and a pair of an identity without one (no MAC).
The two pairs are measured one after the other in each repeat, on the same appliance:

- latency: one message at a time (``publish(..., flush=True)``), from before the publish to
  the subscriber's callback; ``p50_us`` and ``p99_us`` over ``--pings`` messages;
- throughput: ``--messages`` messages of ``--size`` bytes as fast as ``publish`` takes them
  (the client batches them into frames), to the subscriber's last callback: ``msgs_per_s``.

Prints a JSON document: the medians over ``--repeats`` per pair, and their ratio. The
machine's load moves these figures more than the MAC does; ``--kernels`` measures what the MAC
itself costs, in thread CPU time per frame (robust to a shared machine): the appliance's
``sign_session_frames`` then the client's ``check_down_frames`` over batches of 64 frames
of one message of 64 bytes, of 1,440 bytes (a guaranteed UDP frame) and of 16 KiB, against
the copy that restores the frames between rounds (medians over ``--repeats``).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PASSWORD = "bench password"


def _config(port: int, hashed: str) -> str:
    return (f'[appliance]\nname = "bench-mac"\n[clients]\nudp = "127.0.0.1:{port}"\n'
            f'[log]\nlevel = "warning"\n[pm]\nrequire_passwords = false\n'
            f'[pm.identities.alice]\npublish = ["m/#"]\nsubscribe = ["m/#"]\n'
            f'password = "{hashed}"\n'
            f'[pm.identities.bob]\npublish = ["m/#"]\nsubscribe = ["m/#"]\n')


class _Counter:
    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.done = threading.Event()
        self.last_ns = 0

    def __call__(self, msg: object) -> None:
        self.count += 1
        self.last_ns = time.perf_counter_ns()
        if self.count >= self.target:
            self.done.set()

    def expect(self, n: int) -> None:
        self.count = 0
        self.target = n
        self.done.clear()


def _pair(url: str, identity: str, password: str | None) -> tuple:
    from appliance.client import connect

    pub = connect(url, identity, password=password, timeout_s=20)
    sub = connect(url, identity, password=password, timeout_s=20)
    counter = _Counter()
    topic = f"m/{identity}"
    sub.subscribe("m/#", callback=counter)
    pub.publish(topic, b"warm", flush=True)  # registers the topic
    counter.expect(1)
    counter.done.wait(10)
    return pub, sub, counter, topic


def _latency(pair: tuple, pings: int, size: int) -> dict[str, float]:
    pub, _, counter, topic = pair
    payload = bytes(size)
    samples = []
    for _ in range(pings):
        counter.expect(1)
        t0 = time.perf_counter_ns()
        pub.publish(topic, payload, flush=True)
        if not counter.done.wait(5):
            continue
        samples.append((counter.last_ns - t0) / 1_000)
    samples.sort()
    return {"p50_us": statistics.median(samples),
            "p99_us": samples[int(0.99 * (len(samples) - 1))], "lost": pings - len(samples)}


def _throughput(pair: tuple, messages: int, size: int) -> dict[str, float]:
    pub, _, counter, topic = pair
    payload = bytes(size)
    counter.expect(messages)
    t0 = time.perf_counter_ns()
    for _ in range(messages):
        pub.publish(topic, payload)
    pub.flush()
    counter.done.wait(60)
    end = counter.last_ns if counter.count else time.perf_counter_ns()
    return {"msgs_per_s": counter.count / max(1e-9, (end - t0) / 1e9),
            "lost": messages - counter.count}


def kernel_cost(repeats: int, rounds: int = 200) -> dict[str, dict[str, float]]:
    """ns of CPU per frame: sign (appliance) + check (client) vs the restoring copy alone."""
    from datapath.protocol import frame_layout as fl

    return {f"frame_{fl.FRAME_HEADER_BYTES + body}_bytes": _frame_cost(
        fl.FRAME_HEADER_BYTES + body, repeats, rounds) for body in (104, 1_376, 16_384)}


def _frame_cost(size: int, repeats: int, rounds: int, n: int = 64) -> dict[str, float]:
    import numpy as np

    from datapath.protocol import _kernels as kern
    from datapath.protocol import frame_layout as fl
    from datapath.protocol import frame_mac as fm

    key = bytes(range(32))
    keys = fm.new_session_keys(1)
    keys[0, 0] = len(key)
    keys[0, fm.SESSION_KEY_AT:fm.SESSION_KEY_AT + len(key)] = np.frombuffer(key, np.uint8)
    slot = fl.align8(size + fl.AUTH_TRAILER_BYTES)
    buf = np.zeros(n * slot, np.uint8)
    offsets = np.arange(n, dtype=np.int64) * slot
    lengths = np.full(n, size, np.int64)
    for i in range(n):
        kern.write_frame_header(buf, int(offsets[i]), int(offsets[i]) + size, 1,
                                int(fl.FrameType.DATA), 1, 2, 3, 0)
    clean = buf.copy()
    peers = np.full(n, 9, np.int64)
    dests, rows, slots = np.array([9], np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64)
    ab, ac = fm.new_state(b"\x00", 0, 0, 1, 0)
    cab, cac = fm.new_state(key, 0, 0, 0, 0)
    window = fm.new_windows(1)[0]
    verdicts = np.zeros(n, np.int8)

    def both() -> None:
        buf[:] = clean
        lengths[:] = size
        kern.sign_session_frames(buf, offsets, lengths, peers, n, slot, dests, rows, slots, 1,
                                 ab, ac, keys)
        kern.check_down_frames(buf, offsets, lengths, n, kern.DOWN_KEYED, False, cab, cac,
                               window, verdicts)

    def copy() -> None:
        buf[:] = clean
        lengths[:] = size

    both()
    assert (verdicts == fm.OK).all()
    figures = {}
    for name, fn in (("sign_and_check", both), ("copy", copy)):
        samples = []
        for _ in range(repeats):
            t0 = time.thread_time_ns()
            for _ in range(rounds):
                fn()
            samples.append((time.thread_time_ns() - t0) / (rounds * n))
        figures[name] = statistics.median(samples)
    figures["mac_ns_per_frame"] = figures["sign_and_check"] - figures["copy"]
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=1_000)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernels", action="store_true",
                        help="only the MAC's CPU cost per frame (the kernels)")
    args = parser.parse_args(argv)
    if args.kernels:
        print(json.dumps(kernel_cost(args.repeats), indent=1))
        return
    from appliance.control.credentials import hash_password
    from tests.appliance.helpers import free_port

    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="bench-mac-"))
    config = work / "appliance.toml"
    config.write_text(_config(port, hash_password(PASSWORD)))
    code = "import sys; from appliance.ops.cli import main; sys.exit(main(sys.argv[1:]))"
    out = (work / "appliance.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", code, "run", "--config", str(config)],
                            stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        while "topicwire: appliance" not in (work / "appliance.log").read_text():
            if proc.poll() is not None:
                raise SystemExit("the appliance did not start")
            time.sleep(0.1)
        url = f"udp://127.0.0.1:{port}"
        pairs = {"signed": _pair(url, "alice", PASSWORD), "unsigned": _pair(url, "bob", None)}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in pairs}
        for _ in range(args.repeats):
            for name, pair in pairs.items():
                runs[name].append({**_latency(pair, args.pings, args.size),
                                   **_throughput(pair, args.messages, args.size)})
                print(name, runs[name][-1], file=sys.stderr)
        medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                   for name, rs in runs.items()}
        s, u = medians["signed"], medians["unsigned"]
        checked = {name: {"authenticated": pair[1].authenticated_frames,
                          "refused": pair[1].refused_frames} for name, pair in pairs.items()}
        print(json.dumps({"args": vars(args), "medians": medians, "subscribers": checked,
                          "signed_over_unsigned": {
                              "p50": s["p50_us"] / u["p50_us"],
                              "p99": s["p99_us"] / u["p99_us"],
                              "msgs_per_s": s["msgs_per_s"] / u["msgs_per_s"]},
                          "runs": runs}, indent=1))
        for pair in pairs.values():
            pair[0].close()
            pair[1].close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
