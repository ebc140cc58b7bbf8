"""``topicwire bench scale``: one appliance with many client sessions, subscriptions and
registered topics (issue 19, "Scale").

A real appliance (``Appliance`` in this process, its data path forked into a process of its
own as ``topicwire run`` does) with a UDP clients channel on loopback. Clients are light:
each session is one UDP socket of this process sending hand-built native frames (LOGIN,
SUBSCRIBE, REGISTRY_UPDATE: ``datapath.protocol.codec.encode_admin``) and reading the
answers through one epoll; no client API objects, no threads per client. Phases, timed:

- ``preload``: one session registers ``--topics`` topics less the batch below, in frames of
  ``REGISTER_FRAME_ENTRIES`` entries (answered per entry), so the tables hold them;
- ``login``: ``--sessions`` sessions log in (``LOGIN_WINDOW`` logins outstanding at once);
  ``login_s`` from the first LOGIN to the last LOGIN_RESULT;
- ``subscribe_all``: each session subscribes ``--subscriptions`` patterns of 10 keys each
  (one SUBSCRIBE frame per session), answered once the tables holding them are live;
- ``subscribe_10``: one session subscribes one more pattern of 10 keys and waits for its
  answer, ``--repeats`` times (each a new pattern); the median and p90 (ms);
- ``subscribe_100k``: one subscribe of a pattern touching up to 100,000 keys (``scale/0/#``),
  then its unsubscribe; median over ``--big-repeats``;
- ``register``: ``--register`` new topics in one batched request (frames of
  ``REGISTER_FRAME_ENTRIES`` sent back to back, at most ``REGISTER_WINDOW_FRAMES`` of them
  unanswered), ``register_s`` until the registry and the tables hold them all.

``phases`` also gives the CPU seconds of the appliance's control thread during the preload
and the registration (``preload_control_cpu_s``, ``register_control_cpu_s``, from /proc),
and for the registration that of this whole process (``register_process_cpu_s``: the
control thread, the bench's clients) and of the data path's process
(``register_dataplane_cpu_s``):
on a host loaded by other work the wall-clock figures mostly measure the wait for a core.

Topic ``i`` is ``scale/{i // 100000}/{(i // 10) % 10000}/{i % 10}``: ``scale/A/B/+`` touches
10 keys, ``scale/A/#`` up to 100,000. Session ``s``'s ``k``-th subscription is the 10-key
group ``(s * subscriptions + k) mod groups``.

Memory: the resident set (RSS, /proc) of this process plus its forked data path, before the
logins, after them (``bytes_per_idle_session``: the difference over the sessions; it includes
this process's own socket objects, about 1 KiB a session) and after the subscriptions
(``bytes_per_subscription``). ``--profile FILE`` writes a cProfile of the control agent's
thread (pstats; in that thread's CPU time, which other work on the host does not inflate)
for finding where a phase spends its time. ``--trace FILE`` time-stamps each timed subscribe
and unsubscribe end to end, the data path's process included (``bench/scale_trace.py``: the
methods it runs through are wrapped before the appliance forks); the breakdown (per stage,
its median start from the SUBSCRIBE's send and its median duration) goes into the report's
``trace`` and to FILE.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import select
import socket
import statistics
import time
from pathlib import Path
from typing import Any

from bench.procstat import forked_children
from bench.report import build_report, positive_int, progress
from datapath.errors import DeviceError, UserError

NAME = "scale"
HELP = ("one appliance with many sessions, subscriptions and topics: login, subscribe and "
        "registration times, memory per session")
SESSIONS = 20
TOPICS = 2_000
SUBSCRIPTIONS = 10
REGISTER = 1_000
REPEATS = 20
BIG_REPEATS = 3
LOOPBACK = "127.0.0.1"
LOGIN_WINDOW = 256
"""Logins outstanding at once."""
REGISTER_FRAME_ENTRIES = 1_000
"""Registry entries per REGISTRY_UPDATE frame (about 40 KiB: under the clients' 65,504)."""
REGISTER_WINDOW_FRAMES = 4
"""Registration frames sent and not answered yet, at most (about 160 KB: the appliance's
socket buffer holds them)."""
SUBSCRIBE_FRAME_ENTRIES = 200
SUBSCRIBE_WINDOW_SESSIONS = 32
"""Sessions whose subscriptions are sent and not all answered yet, at most."""
"""Subscription entries per SUBSCRIBE frame."""
PHASE_TIMEOUT_S = 1_800.0
"""A phase not done in this long fails the run (it names the phase)."""
SOCKET_RCVBUF = 1 << 20
"""Receive buffer of a session's socket (answers: one datagram per request)."""
REGISTER_RCVBUF = 256 << 20
"""Receive buffer of the registering session's socket (one answer per topic)."""
SO_RCVBUFFORCE = 33
"""Linux: a receive buffer past net.core.rmem_max (root)."""
IDENTITY = "scale"
_COMPONENT = "bench"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=positive_int, default=SESSIONS,
                        help=f"client sessions (default {SESSIONS})")
    parser.add_argument("--topics", type=positive_int, default=TOPICS,
                        help=f"registered topics at the end (default {TOPICS:,})")
    parser.add_argument("--subscriptions", type=positive_int, default=SUBSCRIPTIONS,
                        help=f"subscriptions per session, 10 keys each (default {SUBSCRIPTIONS})")
    parser.add_argument("--register", type=positive_int, default=None,
                        help="topics registered in the one batched request (default: "
                             f"min(--topics / 2, 100,000); {REGISTER:,} at the defaults)")
    parser.add_argument("--repeats", type=positive_int, default=REPEATS,
                        help=f"10-key subscribes timed (default {REPEATS}; the issue's: 1000)")
    parser.add_argument("--big-repeats", type=positive_int, default=BIG_REPEATS,
                        help=f"100,000-key subscribes timed (default {BIG_REPEATS})")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write a cProfile (pstats) of the control agent's thread here")
    parser.add_argument("--trace", type=Path, default=None,
                        help="time stamps of each timed subscribe through the control thread, "
                             "the process link and the data path (bench/scale_trace.py); "
                             "the breakdown goes into the report and to this file")


def topic(i: int) -> str:
    return f"scale/{i // 100_000}/{(i // 10) % 10_000}/{i % 10}"


def group_pattern(g: int) -> str:
    """The pattern of 10-key group ``g`` (topics 10 g .. 10 g + 9)."""
    return f"scale/{g // 10_000}/{g % 10_000}/+"


def rss_bytes(pid: int) -> int:
    """Resident set of ``pid`` (bytes), from /proc/PID/statm."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def appliance_rss() -> int:
    """RSS of this process (which holds the appliance's control side) and its forked data
    path."""
    total = rss_bytes(os.getpid())
    for child in forked_children(os.getpid()):
        try:
            total += rss_bytes(child)
        except OSError:
            continue
    return total


class Clients:
    """``n`` UDP sockets on loopback (one per session) and one epoll over them."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.socks: list[socket.socket] = []
        self.sessions: list[int] = []
        self.by_fd: dict[int, int] = {}
        self.epoll = select.epoll()

    def add(self, rcvbuf: int = SOCKET_RCVBUF) -> int:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:  # answers come one per request: a burst of them must not overflow it
            s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
        except OSError:  # not root: what net.core.rmem_max allows
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.bind((LOOPBACK, 0))
        s.setblocking(False)
        index = len(self.socks)
        self.socks.append(s)
        self.sessions.append(0)
        self.by_fd[s.fileno()] = index
        self.epoll.register(s.fileno(), select.EPOLLIN)
        return index

    def send(self, index: int, frame: bytes | bytearray) -> None:
        sock = self.socks[index]
        while True:
            try:
                sock.sendto(frame, self.target)
                return
            except BlockingIOError:
                time.sleep(0.0005)

    def poll(self, timeout_s: float) -> list[tuple[int, Any, dict]]:
        """(socket index, control kind, document) of the CONTROL answers that arrived."""
        from datapath.protocol.codec import decode_frame
        from datapath.protocol.frame_layout import FrameType

        out = []
        for fd, _ in self.epoll.poll(timeout_s):
            index = self.by_fd[fd]
            sock = self.socks[index]
            while True:
                try:
                    data = sock.recv(65_536)
                except BlockingIOError:
                    break
                frame = decode_frame(data)
                if frame.header.frame_type is not FrameType.CONTROL:
                    continue
                for entry in frame.admin()[1]:
                    out.append((index, entry.kind, json.loads(entry.document)))
        return out

    def close(self) -> None:
        self.epoll.close()
        for s in self.socks:
            s.close()


def _frame(ftype: Any, entries: list, session: int, body: dict | None = None) -> bytearray:
    from datapath.protocol.codec import encode_admin

    return encode_admin(ftype, entries, body_header=body, source_session=session,
                        send_ts_ns=time.time_ns())


def _login_frame(token: int) -> bytearray:
    from datapath.protocol import admin_layout as al
    from datapath.protocol.frame_layout import FrameType

    doc = {"identity": IDENTITY, "ring": None, "token": token, "nonce": os.urandom(16).hex()}
    return _frame(FrameType.CONTROL, [al.Control(al.ControlKind.LOGIN, json.dumps(doc))], 0)


def _subscribe_frame(session: int, patterns: list[tuple[int, str]], add: bool = True
                     ) -> bytearray:
    from datapath.protocol import admin_layout as al
    from datapath.protocol.frame_layout import FrameType

    ftype = FrameType.SUBSCRIBE if add else FrameType.UNSUBSCRIBE
    return _frame(ftype, [al.Subscription(sub_id, 0, 0, 0, p) for sub_id, p in patterns],
                  session)


def _register_frames(session: int, first: int, count: int) -> list[bytearray]:
    from datapath.protocol import admin_layout as al
    from datapath.protocol.frame_layout import FrameType
    from datapath.topics.registry import KEY_MASK, NO_KEY, ZERO_HASH_KEY, topic_key_hash

    frames = []
    for start in range(first, first + count, REGISTER_FRAME_ENTRIES):
        entries = []
        for i in range(start, min(start + REGISTER_FRAME_ENTRIES, first + count)):
            name = topic(i)
            key = topic_key_hash(0, name) & KEY_MASK
            entries.append(al.RegistryEntry(ZERO_HASH_KEY if key == NO_KEY else key, 0, name))
        frames.append(_frame(FrameType.REGISTRY_UPDATE, entries, session, {"version": 0}))
    return frames


def _wait(what: str, done: Any, deadline: float, clients: Clients | None = None,
          on_answer: Any = None) -> None:
    """Poll answers (to ``on_answer``) until ``done()``; fail at ``deadline``."""
    while not done():
        if time.monotonic() > deadline:
            raise DeviceError(f"bench scale: {what} not done within {PHASE_TIMEOUT_S:g} s",
                              component=_COMPONENT)
        if clients is None:
            time.sleep(0.002)
            continue
        for answer in clients.poll(0.05):
            if on_answer is not None:
                on_answer(*answer)


def _send_paced(clients: Clients, index: int, frames: list, answered: dict, count: Any,
                deadline: float) -> None:
    """Send registration ``frames`` back to back, at most REGISTER_WINDOW_FRAMES of them
    unanswered: all at once overflowed the appliance's socket at 900 frames (UDP drops what
    does not fit, and the bench waited for topics that never came)."""
    for k, frame in enumerate(frames):
        floor = (k - REGISTER_WINDOW_FRAMES) * REGISTER_FRAME_ENTRIES
        _wait("a registration frame's answers", lambda f=floor: answered.get(index, 0) >= f,
              deadline, clients, count)
        clients.send(index, frame)


def _start_appliance(sessions: int, topics: int, subscriptions: int) -> Any:
    from appliance.config import parse_config
    from appliance.node import Appliance

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    cfg = parse_config({
        "appliance": {"name": f"scale{port}"},
        "clients": {"udp": f"{LOOPBACK}:{port}", "max_sessions": sessions + 1,
                    "max_guaranteed_sessions": 0,
                    "session_dead_ms": 3_600_000, "max_registrations": min(1_000_000, topics),
                    "max_subscriptions": max(1_024, subscriptions + 16),
                    "max_pending_requests": 65_536},
        "pm": {"require_passwords": False,
               "identities": {IDENTITY: {"publish": ["scale/#"], "subscribe": ["scale/#"]}}},
        "log": {"level": "warning"}})
    return Appliance(cfg).start(), (LOOPBACK, port)


def control_cpu_s(app: Any) -> float:
    """CPU seconds the appliance's control thread has used (/proc: its utime + stime), a
    figure a loaded host does not inflate as it does wall-clock time; 0.0 if not found."""
    import threading

    name = f"{app.config.name}-control"
    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            try:
                with open(f"/proc/self/task/{thread.native_id}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                return 0.0
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def children_cpu_s() -> float:
    """CPU seconds of this process's forked children (the appliance's data path)."""
    total = 0.0
    for child in forked_children(os.getpid()):
        try:
            with open(f"/proc/{child}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _profile_control(app: Any, profiler: cProfile.Profile) -> None:
    """Profile the control agent's duty cycles (it runs on a thread of its own)."""
    agent = app.control
    work = agent.do_work

    def profiled(now_ns: int) -> int:
        profiler.enable()
        try:
            return work(now_ns)
        finally:
            profiler.disable()

    agent.do_work = profiled


def run(args: argparse.Namespace) -> dict[str, Any]:
    from datapath.protocol import admin_layout as al

    sessions, topics, subs = args.sessions, args.topics, args.subscriptions
    batch = args.register if args.register is not None else min(topics // 2, 100_000)
    if batch >= topics:
        raise UserError("--register must be less than --topics", component=_COMPONENT)
    if topics < 20:
        raise UserError("--topics must be at least 20", component=_COMPONENT)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = sessions + 256
    if soft < need:
        if hard < need:
            raise UserError(f"{sessions} sessions need {need} open files; the limit is {hard}",
                            component=_COMPONENT)
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    preload = topics - batch
    groups = preload // 10  # 10-key groups whose topics are registered before the logins
    if groups < 2:
        raise UserError("--topics less --register must hold at least 20 topics",
                        component=_COMPONENT)
    if args.trace is not None:
        from bench import scale_trace

        scale_trace.install(args.trace)
    windows: dict[str, list[tuple[int, int]]] = {"small": [], "big": [], "big_off": []}
    app, target = _start_appliance(sessions, topics, subs)
    profiler = cProfile.Profile(time.thread_time) if args.profile is not None else None
    if profiler is not None:
        _profile_control(app, profiler)
    clients = Clients(target)
    figures: dict[str, float] = {}
    phases: dict[str, float] = {}
    answered: dict[int, int] = {}

    def count(index: int, kind: Any, doc: dict) -> None:
        if kind is al.ControlKind.REQUEST_RESULT:
            answered[index] = answered.get(index, 0) + 1
            if not doc.get("accepted", False):
                raise DeviceError(f"bench scale: refused: {doc}", component=_COMPONENT)

    try:
        rss_start = appliance_rss()
        # -- the registering session and the preload -------------------------------------
        reg = clients.add(REGISTER_RCVBUF)
        logged = {}

        def on_login(index: int, kind: Any, doc: dict) -> None:
            if kind is al.ControlKind.LOGIN_RESULT:
                if not doc.get("accepted"):
                    raise DeviceError(f"bench scale: login refused: {doc.get('reason')}",
                                      component=_COMPONENT)
                clients.sessions[index] = int(doc["session"])
                logged[index] = True
            else:
                count(index, kind, doc)

        deadline = time.monotonic() + PHASE_TIMEOUT_S
        clients.send(reg, _login_frame(1))
        _wait("the registering session's login", lambda: reg in logged, deadline, clients,
              on_login)
        progress(NAME, f"preload: registering {preload:,} topics")
        control = app.control
        start, cpu_start = time.perf_counter(), control_cpu_s(app)
        _send_paced(clients, reg, _register_frames(clients.sessions[reg], 0, preload),
                    answered, count, deadline)
        _wait("the preload", lambda: answered.get(reg, 0) >= preload
              or len(control.registry) >= preload, deadline, clients, count)
        phases["preload_s"] = time.perf_counter() - start
        phases["preload_control_cpu_s"] = control_cpu_s(app) - cpu_start
        progress(NAME, f"preload: {phases['preload_s']:.1f} s")
        rss_before = appliance_rss()
        # -- logins -----------------------------------------------------------------------
        progress(NAME, f"login: {sessions:,} sessions")
        indexes = [clients.add() for _ in range(sessions)]
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        start = time.perf_counter()
        sent = 0
        while len(logged) < sessions + 1:
            while sent < sessions and sent - (len(logged) - 1) < LOGIN_WINDOW:
                clients.send(indexes[sent], _login_frame(sent + 2))
                sent += 1
            if time.monotonic() > deadline:
                raise DeviceError("bench scale: the logins did not end", component=_COMPONENT)
            for answer in clients.poll(0.05):
                on_login(*answer)
        figures["login_s"] = time.perf_counter() - start
        progress(NAME, f"login: {figures['login_s']:.2f} s")
        time.sleep(0.5)  # the tables of the new sessions' egresses settle
        rss_logged = appliance_rss()
        # -- the subscriptions of every session -------------------------------------------
        progress(NAME, f"subscribe_all: {sessions:,} x {subs} subscriptions")
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        start = time.perf_counter()
        answered.clear()
        for n, index in enumerate(indexes):
            floor = (n - SUBSCRIBE_WINDOW_SESSIONS) * subs  # (the appliance's socket)
            _wait("the subscriptions' answers", lambda f=floor: sum(answered.values()) >= f,
                  deadline, clients, count)
            wanted = [(k + 1, group_pattern((n * subs + k) % groups)) for k in range(subs)]
            for at in range(0, len(wanted), SUBSCRIBE_FRAME_ENTRIES):
                clients.send(index, _subscribe_frame(clients.sessions[index],
                                                     wanted[at:at + SUBSCRIBE_FRAME_ENTRIES]))
            for answer in clients.poll(0):
                count(*answer)
        _wait("the subscriptions", lambda: sum(answered.values()) >= sessions * subs,
              deadline, clients, count)
        phases["subscribe_all_s"] = time.perf_counter() - start
        progress(NAME, f"subscribe_all: {phases['subscribe_all_s']:.1f} s")
        time.sleep(0.5)
        rss_subscribed = appliance_rss()
        # -- one subscribe of 10 keys, timed ----------------------------------------------
        progress(NAME, f"subscribe_10: {args.repeats} subscribes of 10 keys")
        one = indexes[0]
        sid = clients.sessions[one]

        def timed(pattern: str, add: bool = True, window: str = "small") -> float:
            answered.clear()
            begin, begin_ns = time.perf_counter(), time.monotonic_ns()
            clients.send(one, _subscribe_frame(sid, [(1_000_000, pattern)], add))
            _wait(f"the subscribe of {pattern!r}", lambda: answered.get(one, 0) >= 1,
                  time.monotonic() + PHASE_TIMEOUT_S, clients, count)
            windows[window].append((begin_ns, time.monotonic_ns()))
            return (time.perf_counter() - begin) * 1e3

        small = [timed(group_pattern((subs + r) % groups)) for r in range(args.repeats)]
        small.sort()
        figures["subscribe_10_keys_median_ms"] = statistics.median(small)
        figures["subscribe_10_keys_p90_ms"] = small[int(0.9 * (len(small) - 1))]
        progress(NAME, f"subscribe_10: median {figures['subscribe_10_keys_median_ms']:.1f} ms")
        # -- one subscribe of up to 100,000 keys ----------------------------------------
        big_keys = min(preload, 100_000)
        progress(NAME, f"subscribe_100k: {args.big_repeats} subscribes of {big_keys:,} keys")
        big, big_off = [], []
        for _ in range(args.big_repeats):
            big.append(timed("scale/0/#", window="big"))
            big_off.append(timed("scale/0/#", add=False, window="big_off"))
        figures["subscribe_100k_keys_median_ms"] = statistics.median(big)
        figures["unsubscribe_100k_keys_median_ms"] = statistics.median(big_off)
        progress(NAME, f"subscribe_100k: {figures['subscribe_100k_keys_median_ms']:.0f} ms, "
                 f"unsubscribe {figures['unsubscribe_100k_keys_median_ms']:.0f} ms")
        # -- one batched registration ------------------------------------------------------
        progress(NAME, f"register: {batch:,} topics in one batched request")
        frames = _register_frames(clients.sessions[reg], preload, batch)
        answered.clear()
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        start, cpu_start = time.perf_counter(), control_cpu_s(app)
        dp_start, own_start = children_cpu_s(), time.process_time()
        _send_paced(clients, reg, frames, answered, count, deadline)
        _wait("the batched registration", lambda: answered.get(reg, 0) >= batch
              or len(control.registry) >= topics, deadline, clients, count)
        _wait("the registration's tables",
              lambda: (control.compiler.snapshot is not None
                       and len(control.compiler.snapshot.entries.key_rows) >= topics),
              deadline)
        figures["register_s"] = time.perf_counter() - start
        phases["register_control_cpu_s"] = control_cpu_s(app) - cpu_start
        phases["register_process_cpu_s"] = time.process_time() - own_start
        phases["register_dataplane_cpu_s"] = children_cpu_s() - dp_start
        progress(NAME, f"register: {figures['register_s']:.2f} s (CPU: control thread "
                 f"{phases['register_control_cpu_s']:.2f} s, this process "
                 f"{phases['register_process_cpu_s']:.2f} s, data path process "
                 f"{phases['register_dataplane_cpu_s']:.2f} s)")
        rss_end = appliance_rss()
        figures["bytes_per_idle_session"] = (rss_logged - rss_before) / sessions
        figures["bytes_per_subscription"] = (rss_subscribed - rss_logged) / (sessions * subs)
        figures["rss_mib"] = rss_end / 2**20
    finally:
        if profiler is not None:
            control_agent = app.control
            if "do_work" in vars(control_agent):
                del control_agent.do_work
        clients.close()
        app.stop()
        if args.trace is not None:
            scale_trace.uninstall()
    if profiler is not None:
        profiler.dump_stats(str(args.profile))
    trace = None
    if args.trace is not None:
        trace = {name: scale_trace.breakdown(w) for name, w in windows.items()}
        scale_trace.dump(args.trace, trace)
    params = {"sessions": sessions, "topics": topics, "subscriptions_per_session": subs,
              "keys_per_subscription": 10, "register_batch": batch, "preloaded_topics": preload,
              "repeats": args.repeats, "big_repeats": args.big_repeats,
              "big_subscribe_keys": big_keys, "subscribe_10_keys_ms": small,
              "subscribe_100k_keys_ms": big, "unsubscribe_100k_keys_ms": big_off,
              "phases": phases,
              "rss_bytes": {"start": rss_start, "before_logins": rss_before,
                            "after_logins": rss_logged, "after_subscriptions": rss_subscribed,
                            "end": rss_end},
              "clients": "one UDP socket per session on loopback, hand-built native frames "
                         "(LOGIN, SUBSCRIBE, REGISTRY_UPDATE), one epoll",
              "goals": {"login_s": "< 30 at 10,000 sessions",
                        "subscribe_10_keys_median_ms": "< 1 (median of 1,000)",
                        "subscribe_100k_keys_median_ms": "< 100",
                        "register_s": "< 2 for 100,000 topics",
                        "bytes_per_idle_session": "< 65,536"},
              "load_average": os.getloadavg()}
    if trace is not None:
        params["trace"] = trace
    return build_report(NAME, params, {"topicwire": figures})
