"""``topicwire pub`` and ``topicwire sub``: publish to and subscribe through an appliance.

    topicwire pub --appliance udp://127.0.0.1:47471 --topic prices/eu/x --count 1000 --rate 500
    topicwire sub --appliance shm://core1 'prices/#' --count 1000 --stats

(mosquitto_pub/sub and ``nats pub/sub`` are the models.) ``--appliance`` takes the client
API's URLs (``udp://HOST:PORT``, ``shm://RING``, ``embedded:``; a bare ``HOST:PORT`` means
UDP). ``sub`` prints one line per message (``--json``: one JSON object per line), or with
``--stats`` one JSON object when it ends: received (``delivered``), gaps and duplicates (per
publisher stream and topic, from the message sequence numbers), what the appliance's
flow-control policy dropped (``dropped_by_policy``, per policy, ``conflated``; reported by
the appliance), ``lost`` (loss events, and gaps that no report explains), latency p50/p99
(publish to receive). ``--flow-policy`` sets the subscription's flow-control policy
(docs/flow-control.md); ``--count`` counts the messages delivered and dropped by it.
It ends after ``--count`` messages, ``--seconds`` or SIGINT/SIGTERM (and says which).

Both say on stderr what happens to their connection: lost (no answer from the appliance for
``--session-timeout`` seconds, or it restarted), each reconnection attempt, reconnected (``sub``
has subscribed again), or given up after ``--reconnect`` seconds: then they exit with 1.
With ``--standby ADDR`` the session moves to ADDR when its appliance is lost, and also, with
``--move-latency-ms N``, ``--move-loss PCT`` or ``--move-jitter-ms N``, when its measured
path stays above such a bound over ``--move-window`` seconds (``connect(..., move_on=)``).
``pub --qos guaranteed`` waits up to ``PUB_ACK_TIMEOUT_S`` at the end for the appliance to
acknowledge every message, and exits with 1 when some were not, saying how many (with
``--json`` in ``unacknowledged``, by reason in ``failed_reasons``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from appliance.client.stats import SubStats
from appliance.ops.cli.exit_codes import FAILURE, INTERRUPTED
from datapath.errors import UserError

PUB_DEFAULT_SIZE_BYTES = 64
"""Payload size of ``pub`` messages unless ``--size`` says otherwise."""
SUB_POLL_S = 0.1
"""How often ``sub`` checks its end conditions while waiting for messages."""
PUB_ACK_TIMEOUT_S = 5.0
"""How long ``pub`` waits at the end for the appliance to acknowledge guaranteed messages."""
EXIT_NOT_DELIVERED = FAILURE
"""Exit code of ``pub`` and ``sub`` when guaranteed messages were not acknowledged or the
connection was lost for good (exit_codes: a runtime failure)."""


APPLIANCE_ENV = "TOPICWIRE_APPLIANCE"
"""The environment variable ``--appliance`` defaults to (as ``NATS_URL`` is for nats)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``pub`` and ``sub``."""
    pub = subparsers.add_parser("pub", help="publish messages through an appliance")
    pub.add_argument("--appliance", metavar="ADDR", default=os.environ.get(APPLIANCE_ENV),
                     help="udp://HOST:PORT, shm://RING, embedded: (HOST:PORT means udp); "
                     f"default ${APPLIANCE_ENV}")
    pub.add_argument("--topic", required=True, help="the topic to publish to")
    pub.add_argument("--count", type=int, default=1, help="messages to publish (default 1)")
    pub.add_argument("--rate", type=float, default=0.0,
                     help="messages per second (default: as fast as possible)")
    pub.add_argument("--size", type=int, default=PUB_DEFAULT_SIZE_BYTES,
                     help=f"payload bytes (default {PUB_DEFAULT_SIZE_BYTES}; up to 16 MiB, "
                          "larger than a frame travels as segments)")
    pub.add_argument("--message", help="the payload text (instead of --size bytes)")
    pub.add_argument("--qos", default="best-effort",
                     choices=("best-effort", "last-value", "guaranteed"))
    pub.add_argument("--identity", default="anonymous", help="who to log in as")
    pub.add_argument("--namespace", type=int, default=0)
    pub.add_argument("--json", action="store_true", help="print the summary as JSON")
    _connection_args(pub)
    pub.set_defaults(handler=run_pub)

    sub = subparsers.add_parser("sub", help="subscribe through an appliance and print messages")
    sub.add_argument("pattern", help="topic pattern, e.g. 'prices/#'")
    sub.add_argument("--appliance", metavar="ADDR", default=os.environ.get(APPLIANCE_ENV),
                     help="udp://HOST:PORT, shm://RING, embedded: (HOST:PORT means udp); "
                     f"default ${APPLIANCE_ENV}")
    sub.add_argument("--selector", help="JMS selector over the message's fields")
    sub.add_argument("--count", type=int, default=0, help="stop after this many messages")
    sub.add_argument("--seconds", type=float, default=0.0, help="stop after this long")
    sub.add_argument("--stats", action="store_true",
                     help="print one JSON object of statistics at the end instead of messages")
    sub.add_argument("--json", action="store_true", help="print messages as JSON lines")
    sub.add_argument("--qos", default="best-effort",
                     choices=("best-effort", "last-value", "guaranteed"))
    sub.add_argument("--identity", default="anonymous", help="who to log in as")
    sub.add_argument("--durable", metavar="NAME", default=None,
                     help="a durable subscription: the appliance's cache keeps its place "
                          "while it is away; the next sub with this name goes on from there")
    sub.add_argument("--namespace", type=int, default=0)
    sub.add_argument("--flow-policy", metavar="POLICY", default=None,
                     help="what the appliance does with this subscription's messages while "
                          "this subscriber cannot keep up: throttle (hold the publishers), "
                          "drop-oldest, conflate (keep the newest per topic); default: the "
                          "identity's or P&M's policy, else the QoS's")
    _connection_args(sub)
    sub.set_defaults(handler=run_sub)


def _connection_args(parser: argparse.ArgumentParser) -> None:
    from appliance.client.settings import RECONNECT_S, SESSION_TIMEOUT_S

    parser.add_argument("--session-timeout", type=float, default=SESSION_TIMEOUT_S,
                        metavar="S", help="the connection is lost after this long without an "
                        f"answer from the appliance (default {SESSION_TIMEOUT_S:g})")
    parser.add_argument("--reconnect", type=float, default=RECONNECT_S, metavar="S",
                        help="then try to connect again for this long; 0: exit at once "
                        f"(default {RECONNECT_S:g})")
    parser.add_argument("--standby", metavar="ADDR", default=None,
                        help="a standby appliance: the session moves there when the "
                        "appliance is lost (and a guaranteed subscription gets what it "
                        "missed from the standby's cache)")
    parser.add_argument("--move-latency-ms", type=float, default=None, metavar="N",
                        help="with --standby: move the session also when its median round "
                        "trip to its appliance stays above N ms over --move-window")
    parser.add_argument("--move-loss", type=float, default=None, metavar="PCT",
                        help="with --standby: move when more than PCT %% of the session's "
                        "probes go unanswered over --move-window")
    parser.add_argument("--move-jitter-ms", type=float, default=None, metavar="N",
                        help="with --standby: move when the mean difference of consecutive "
                        "round trips stays above N ms over --move-window")
    parser.add_argument("--move-window", type=float, default=None, metavar="S",
                        help="the window the move bounds are judged over (default 5)")
    parser.add_argument("--move-hold-down", type=float, default=None, metavar="S",
                        help="no move for a bound within S seconds of the last move "
                        "(default 30)")
    parser.add_argument("--password-file", metavar="FILE", default=None,
                        help="the identity's password, on the first line of FILE (for an "
                        "identity P&M gives a password; never sent: the login proves it)")


PASSWORD_FILE_MAX_BYTES = 4_096


def _password(path: str | None, command: str) -> bytes | None:
    """The first line of ``--password-file`` (a missing, unreadable or empty file is a usage
    error naming the flag)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(PASSWORD_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise UserError(f"--password-file {path}: {exc.strerror or exc}",
                        component=command) from None
    if len(data) > PASSWORD_FILE_MAX_BYTES:
        raise UserError(f"--password-file {path}: longer than {PASSWORD_FILE_MAX_BYTES} "
                        "bytes (give the password on its first line)", component=command)
    line = data.split(b"\n", 1)[0].rstrip(b"\r")
    if not line:
        raise UserError(f"--password-file {path}: the first line is empty", component=command)
    return line


def _url(address: str) -> str:
    return address if "://" in address or address.startswith("embedded:") else f"udp://{address}"


class ConnectionReport:
    """``on_state`` of ``pub`` and ``sub``: one line on stderr per change of the connection,
    and an event set on each, for the command's loop to wait on."""

    def __init__(self, command: str, address: str, pattern: str | None = None) -> None:
        import threading

        self.command = command
        self.address = address
        self.pattern = pattern
        self.changed = threading.Event()
        self.gave_up: str | None = None
        self.losses = 0

    def __call__(self, change) -> None:  # noqa: ANN001 - appliance.client.StateChange
        if change.state == "lost":
            self.losses += 1
            failed = (f"; {change.failed} guaranteed messages not acknowledged"
                      if change.failed else "")
            self._say(f"connection to {self.address} lost: {change.reason}{failed}")
        elif change.state == "reconnecting":
            if change.attempt == 1:
                self._say(f"reconnecting to {self.address}")
            else:
                self._say(f"reconnecting to {self.address}, attempt {change.attempt} "
                          f"({change.reason})")
        elif change.state == "reconnected":
            again = f"; subscribed to {self.pattern} again" if self.pattern else ""
            if change.appliance and change.appliance != _url(self.address):
                self.address = change.appliance
                why = change.reason.partition(": ")[2]
                self._say(f"session moved to {change.appliance} (attempt {change.attempt}"
                          f"{'; ' + why if why else ''}){again}")
            else:
                self._say(f"reconnected to {self.address} (attempt {change.attempt}){again}")
        elif change.state == "closed" and change.reason != "client closed":
            self.gave_up = change.reason
            self._say(f"connection closed: {change.reason}")
        self.changed.set()

    def _say(self, text: str) -> None:
        print(f"topicwire: {self.command}: {text}", file=sys.stderr, flush=True)


def _check(args: argparse.Namespace) -> None:
    """Every argument checked before anything is sent: a bad one is one line and exit 2."""
    from appliance.client import ClientError
    from appliance.client.checks import (
        MAX_NAMESPACE,
        check_identity,
        check_int,
        check_pattern,
        check_seconds,
        check_topic,
    )

    name = args.command_name
    if not args.appliance:
        raise UserError(f"give --appliance ADDR (udp://HOST:PORT, HOST:PORT, shm://RING, "
                        f"embedded:) or set ${APPLIANCE_ENV}", component=name)
    if args.count < 0 or getattr(args, "rate", 0) < 0:
        raise UserError("--count and --rate must not be negative", component=name)
    try:
        check_identity(args.identity)
        check_int("--namespace", args.namespace, MAX_NAMESPACE)
        if name == "pub":
            check_topic(args.topic)
            if not math.isfinite(args.rate):
                raise ClientError(f"--rate is a finite number of messages per second, not "
                                  f"{args.rate}")
        else:
            check_pattern(args.pattern)
            check_seconds("--seconds", args.seconds)
            if args.flow_policy is not None:
                from datapath.flow_control import FlowControlError, policy_from_name

                try:
                    policy_from_name(args.flow_policy, "--flow-policy")
                except FlowControlError as exc:
                    raise ClientError(str(exc).removeprefix("flow-control: ")) from None
            if args.durable is not None:
                from appliance.cache.durables import NAME_RE

                if not NAME_RE.fullmatch(args.durable):
                    raise ClientError(f"--durable {args.durable!r}: use 1 to 64 letters, "
                                      "digits, '.', '_' or '-', beginning with a letter or "
                                      "digit")
                if args.selector or args.qos != "best-effort":
                    raise ClientError("--durable takes no --selector or --qos: its messages "
                                      "come from the appliance's cache as kept")
    except ClientError as exc:
        raise UserError(str(exc).removeprefix("client: "), component=name) from None


_MOVE_OPTIONS = {"latency_ms": "--move-latency-ms", "jitter_ms": "--move-jitter-ms",
                 "window_s": "--move-window", "hold_down_s": "--move-hold-down"}


def _move_bounds(args: argparse.Namespace):  # noqa: ANN202 - a MoveBounds or None
    """The ``--move-*`` options as ``connect``'s ``move_on`` (None when none is given); a bad
    value is a ``UserError`` of one line naming the option."""
    from appliance.client import ClientError, MoveBounds

    name = args.command_name
    given = {"latency_ms": args.move_latency_ms, "jitter_ms": args.move_jitter_ms,
             "window_s": args.move_window, "hold_down_s": args.move_hold_down}
    if all(v is None for v in given.values()) and args.move_loss is None:
        return None
    if not args.standby:
        raise UserError("--move-latency-ms, --move-loss and --move-jitter-ms need --standby "
                        "(the appliance the session moves to)", component=name)
    loss = args.move_loss
    if loss is not None and not (math.isfinite(loss) and 0 < loss < 100):
        raise UserError(f"--move-loss is a percentage above 0 and below 100, not {loss:g}",
                        component=name)
    bounds = {k: v for k, v in given.items() if v is not None}
    if loss is not None:
        bounds["loss_ratio"] = loss / 100
    try:
        return MoveBounds(**bounds)
    except ClientError as exc:
        text = str(exc).removeprefix("client: ").removeprefix("move_on: ")
        for key, option in _MOVE_OPTIONS.items():
            text = text.replace(key, option)
        text = text.replace("give at least one of --move-latency-ms, --move-jitter-ms, "
                            "loss_ratio", "give at least one of --move-latency-ms, "
                            "--move-loss, --move-jitter-ms with --move-window or "
                            "--move-hold-down")
        raise UserError(text, component=name) from None


def _connect(args: argparse.Namespace, report: ConnectionReport):  # noqa: ANN202 - a Client
    from appliance.client import ClientError, connect

    _check(args)
    move_on = _move_bounds(args)
    password = _password(args.password_file, args.command_name)
    try:
        return connect(_url(args.appliance), args.identity, on_state=report,
                       session_timeout_s=args.session_timeout, reconnect_s=args.reconnect,
                       password=password,
                       standby=_url(args.standby) if args.standby else None,
                       move_on=move_on)
    except ClientError as exc:
        if "session_timeout_s" in str(exc) or "reconnect_s" in str(exc):
            raise UserError(str(exc).removeprefix("client: ").replace(
                "session_timeout_s", "--session-timeout").replace("reconnect_s", "--reconnect"),
                component=args.command_name) from None
        raise


def run_pub(args: argparse.Namespace) -> int:
    from appliance.client import BackPressureError, ConnectionLostError, UnacknowledgedError
    from datapath.protocol.extension_layout import MAX_MESSAGE_BYTES

    if not 0 <= args.size <= MAX_MESSAGE_BYTES:
        raise UserError(f"--size is 0 to {MAX_MESSAGE_BYTES} bytes (16 MiB), not {args.size}",
                        component="pub")
    try:
        payload = args.message.encode() if args.message is not None else bytes(
            (i * 7) & 0xFF for i in range(args.size))
    except UnicodeEncodeError:
        raise UserError("--message is not valid UTF-8 text", component="pub") from None
    args.command_name = "pub"
    report = ConnectionReport("pub", args.appliance or "")
    client = _connect(args, report)
    guaranteed = args.qos == "guaranteed"
    sent = 0
    failed: dict[str, int] = {}
    pending = 0
    held_off = 0

    def count(exc: UnacknowledgedError) -> None:
        nonlocal pending
        for reason, n in exc.reasons.items():
            failed[reason] = failed.get(reason, 0) + n
        pending = exc.pending

    start = time.perf_counter()
    interrupted = False
    try:
        i = 0
        while i < args.count and report.gave_up is None:
            try:
                if args.rate:
                    wait = start + i / args.rate - time.perf_counter()
                    if wait > 0:
                        client.flush()
                        time.sleep(wait)
                client.publish(args.topic, payload, qos=args.qos, namespace=args.namespace)
            except UnacknowledgedError as exc:
                count(exc)
                continue
            except BackPressureError:
                held_off += 1  # a throttling subscriber still holds us: offer it again
                continue
            except ConnectionLostError:
                # wait until the client is connected again (or gives up), then go on
                while client.state != "connected" and report.gave_up is None:
                    report.changed.wait(SUB_POLL_S)
                    report.changed.clear()
                continue
            sent += 1
            i += 1
        if report.gave_up is None:
            try:
                client.flush(timeout=PUB_ACK_TIMEOUT_S if guaranteed else None)
            except UnacknowledgedError as exc:
                count(exc)
            except ConnectionLostError:
                pass
    except KeyboardInterrupt:
        interrupted = True
        print("topicwire: pub: interrupted", file=sys.stderr, flush=True)
    finally:
        client.close()
        for reason, n in client.close_failures.items():
            if pending and reason == "session closed":  # those the final wait left pending
                reason = f"not acknowledged within {PUB_ACK_TIMEOUT_S:g} s"
            failed[reason] = failed.get(reason, 0) + n
    elapsed = time.perf_counter() - start
    unacknowledged = sum(failed.values()) if guaranteed else 0
    summary = {"sent": sent, "seconds": round(elapsed, 6),
               "msgs_per_s": round(sent / elapsed, 1) if elapsed > 0 else 0.0,
               "connection_losses": report.losses, "reconnects": client.reconnects,
               "dropped_at_send": client.messages_dropped_at_send,
               "flow_waits": client._hold.waits, "back_pressure_errors": held_off}
    if guaranteed:
        summary.update(acknowledged=client.connection_counters()["acknowledged"],
                       unacknowledged=unacknowledged, failed_reasons=failed)
    if report.gave_up is not None:
        summary["gave_up"] = report.gave_up
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"published {sent} messages to {args.topic} in {elapsed:.3f} s "
              f"({summary['msgs_per_s']} msg/s)", file=sys.stderr)
    if unacknowledged:
        print(f"topicwire: pub: {unacknowledged} of {sent} guaranteed messages were not "
              f"acknowledged by the appliance ({_reasons(failed)})", file=sys.stderr,
              flush=True)
    if report.gave_up is not None:
        print(f"topicwire: pub: stopped after {sent} of {args.count} messages: "
              f"{report.gave_up}", file=sys.stderr, flush=True)
    if interrupted:  # what was sent is summed up above; the code says it did not finish
        return INTERRUPTED
    return EXIT_NOT_DELIVERED if unacknowledged or report.gave_up is not None else 0


def _reasons(failed: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(failed.items(),
                                                               key=lambda kv: -kv[1]))


def _durable_loss(name: str, loss) -> str:  # noqa: ANN001 - appliance.client.Loss
    """The line ``sub --durable`` prints for a loss event of its durable subscription."""
    if loss.reason in ("RETENTION", "CACHE_DISK_LIMIT"):
        where = f"cache sequences {loss.first_seq}..{loss.last_seq}, deleted"
    elif loss.first_seq:
        where = (f"origin {loss.origin} stream {loss.stream} sequences "
                 f"{loss.first_seq}..{loss.last_seq}, not kept")
    else:
        where = "not kept"
    count = loss.messages or "an unknown number of"  # CACHE_RESTART, CACHE_SESSION_LOST
    return (f"durable {name!r}: lost {count} messages on {loss.topic or '?'} "
            f"({loss.reason}: {where} by the appliance's cache)")


def _format(msg, as_json: bool) -> str:  # noqa: ANN001 - appliance.client.Message
    try:
        text = msg.payload.decode("utf-8")
        encoding = "utf-8"
    except UnicodeDecodeError:
        text = msg.payload.hex()
        encoding = "hex"
    if as_json:
        return json.dumps({"topic": msg.topic, "payload": text, "encoding": encoding,
                           "sequence": msg.sequence, "qos": msg.qos,
                           "latency_us": round(msg.latency_ns / 1e3, 3)})
    return f"{msg.topic} {text}"


def run_sub(args: argparse.Namespace) -> int:
    import signal
    import threading

    stop = threading.Event()
    stopped: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopped.append(signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    stats = SubStats()
    args.command_name = "sub"
    report = ConnectionReport("sub", args.appliance or "", args.pattern)
    client = _connect(args, report)
    why = None
    sub = None
    try:
        def on_loss(loss) -> None:  # noqa: ANN001 - appliance.client.Loss
            stats.lost += loss.messages
            if loss.reason == "SESSION_LOST":  # the connection: how many is not known
                print("topicwire: sub: guaranteed messages published while the connection was "
                      "lost are missing (how many is not known)", file=sys.stderr, flush=True)
            elif args.durable is not None:  # what the cache did not keep, or deleted
                print(f"topicwire: sub: {_durable_loss(args.durable, loss)}", file=sys.stderr,
                      flush=True)
            elif not args.stats:
                print(f"topicwire: lost {loss.messages} messages of origin {loss.origin} "
                      f"stream {loss.stream} ({loss.reason})", file=sys.stderr, flush=True)

        sub = client.subscribe(args.pattern, args.selector, qos=args.qos, on_loss=on_loss,
                               namespace=args.namespace, durable=args.durable,
                               flow_policy=args.flow_policy)
        durable = f" (durable {args.durable!r})" if args.durable else ""
        print(f"topicwire: subscribed to {args.pattern}{durable} at {client.node}",
              file=sys.stderr, flush=True)
        deadline = time.monotonic() + args.seconds if args.seconds else None
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            if args.count and stats.received + sum(sub.policy_drops.values()) >= args.count:
                break  # every message accounted for: delivered, or dropped by the policy
            if report.gave_up is not None:
                break
            msg = sub.get(timeout=SUB_POLL_S)
            if msg is None:
                if sub.closed:  # the appliance ended it (said on stderr by the client)
                    report.gave_up = report.gave_up or "the subscription was ended"
                    break
                continue
            stats.on_message(msg)
            if not args.stats:
                print(_format(msg, args.json), flush=True)
        if stop.is_set():
            why = stopped[0] if stopped else "a signal"
            print(f"topicwire: sub: stopping ({why}) after {stats.received} messages",
                  file=sys.stderr, flush=True)
    finally:
        client.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.stats:
        summary = stats.summary(sub.policy_drops if sub is not None else None)
        summary.update(connection_losses=report.losses, reconnects=client.reconnects)
        if report.gave_up is not None:
            summary["gave_up"] = report.gave_up
        print(json.dumps(summary), flush=True)
    if report.gave_up is not None:
        print(f"topicwire: sub: exiting after {stats.received} messages: {report.gave_up}",
              file=sys.stderr, flush=True)
        return EXIT_NOT_DELIVERED
    return 0
