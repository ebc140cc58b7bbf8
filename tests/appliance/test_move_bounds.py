"""The judgement of a session's move bounds (appliance/client/pathwatch.py), on a clock the
test drives: no sockets, no sleeps."""

from __future__ import annotations

import argparse

import pytest

from appliance.client import ClientError, MoveBounds
from appliance.client.pathwatch import MAX_OUTSTANDING, MIN_SAMPLES, PathMonitor
from datapath.errors import UserError

MS = 1_000_000
S = 1_000_000_000


def _run(monitor: PathMonitor, start: int, until: int, rtt_of, step: int = MS):
    """Drive ``monitor`` from ``start`` to ``until``: probes when due, each answered after
    ``rtt_of(number)`` ns (None: never); the first verdict and when it came, or None."""
    answers: list[tuple[int, int]] = []
    t = start
    while t < until:
        number = monitor.probe_due(t)
        if number:
            rtt = rtt_of(number)
            if rtt is not None:
                answers.append((t + rtt, number))
        for at, n in [a for a in answers if a[0] <= t]:
            monitor.on_answer(n, at)
            answers.remove((at, n))
        verdict = monitor.verdict(t)
        if verdict is not None:
            return t, verdict
        t += step
    return None


def test_latency_above_the_bound_over_the_window_moves_once_the_window_is_whole():
    bounds = MoveBounds(latency_ms=100, window_s=1, probe_interval_ms=50, hold_down_s=0)
    monitor = PathMonitor(bounds, 0)
    at, (kind, reason) = _run(monitor, 0, 5 * S, lambda n: 212 * MS)
    assert kind == "latency"
    assert reason == "latency 212 ms above 100 ms over 1 s"
    assert at >= 1 * S  # not before the window was measured whole


def test_latency_under_the_bound_and_a_single_slow_answer_do_not_move():
    bounds = MoveBounds(latency_ms=100, window_s=1, probe_interval_ms=50, hold_down_s=0)
    # one answer in twenty takes 900 ms: the median stays at 2 ms
    assert _run(PathMonitor(bounds, 0), 0, 10 * S,
                lambda n: 900 * MS if n % 20 == 0 else 2 * MS) is None


def test_jitter_is_the_mean_absolute_difference_of_consecutive_round_trips():
    bounds = MoveBounds(jitter_ms=30, window_s=1, probe_interval_ms=100, hold_down_s=0)
    monitor = PathMonitor(bounds, 0)
    rtts = [10, 50, 10, 50, 10, 50, 10, 50, 10, 50]  # |differences| all 40 ms
    for i, rtt in enumerate(rtts):
        t = i * 100 * MS
        number = monitor.probe_due(t)
        monitor.on_answer(number, t + rtt * MS)
    fig = monitor.figures(int(0.95 * S))
    assert fig.answered == 10 and fig.jitter_ms == pytest.approx(40.0)
    assert fig.latency_ms == pytest.approx(30.0)  # the median of five 10s and five 50s
    kind, reason = monitor.verdict(1 * S)
    assert kind == "jitter" and reason == "jitter 40 ms above 30 ms over 1 s"


def test_steady_round_trips_have_no_jitter():
    bounds = MoveBounds(jitter_ms=5, window_s=1, probe_interval_ms=50, hold_down_s=0)
    assert _run(PathMonitor(bounds, 0), 0, 5 * S, lambda n: 80 * MS) is None


def test_loss_counts_probes_unanswered_after_the_loss_timeout():
    bounds = MoveBounds(loss_ratio=0.2, window_s=2, probe_interval_ms=50, hold_down_s=0)
    monitor = PathMonitor(bounds, 0)
    at, (kind, reason) = _run(monitor, 0, 10 * S, lambda n: None if n % 2 else 1 * MS)
    assert kind == "loss" and reason.startswith("loss 50% of") and "above 20% over 2 s" in reason
    assert at >= 3 * S  # the window, and the loss timeout of its last probes
    assert monitor.lost >= MIN_SAMPLES // 2


def test_loss_under_the_bound_does_not_move():
    bounds = MoveBounds(loss_ratio=0.2, window_s=1, probe_interval_ms=50, hold_down_s=0)
    assert _run(PathMonitor(bounds, 0), 0, 10 * S,
                lambda n: None if n % 10 == 0 else 1 * MS) is None


def test_an_answer_slower_than_the_latency_bound_is_latency_not_loss():
    bounds = MoveBounds(latency_ms=600, loss_ratio=0.5, window_s=3, probe_interval_ms=100,
                        hold_down_s=0)
    monitor = PathMonitor(bounds, 0)
    assert monitor.lost_after_ns == 1_200 * MS
    at, (kind, _) = _run(monitor, 0, 10 * S, lambda n: 1_100 * MS)
    assert kind == "latency" and monitor.lost == 0


def test_hold_down_after_a_move_and_measurement_begins_anew():
    bounds = MoveBounds(latency_ms=100, window_s=1, probe_interval_ms=50, hold_down_s=10)
    monitor = PathMonitor(bounds, 0)
    at, (kind, _) = _run(monitor, 0, 20 * S, lambda n: 300 * MS)  # no hold-down at first
    assert kind == "latency" and 1 * S <= at < 2 * S
    monitor.restart(at)  # the session moved
    assert monitor.figures(at).samples == 0
    again = _run(monitor, at, at + 30 * S, lambda n: 300 * MS)
    assert again is not None and again[0] >= at + 10 * S


def test_state_is_bounded():
    bounds = MoveBounds(loss_ratio=0.99, window_s=3_600, probe_interval_ms=10,
                        hold_down_s=0)
    monitor = PathMonitor(bounds, 0)
    for i in range(20_000):
        monitor.probe_due(i * 10 * MS)
        assert len(monitor._outstanding) <= MAX_OUTSTANDING
    assert len(monitor._samples) <= 4_096


@pytest.mark.parametrize(("kwargs", "words"), [
    ({}, "give at least one of"),
    ({"latency_ms": 0}, "latency_ms must be milliseconds"),
    ({"latency_ms": float("nan")}, "latency_ms"),
    ({"jitter_ms": -1}, "jitter_ms"),
    ({"loss_ratio": 1.0}, "loss_ratio must be a ratio in (0, 1)"),
    ({"loss_ratio": True}, "loss_ratio"),
    ({"latency_ms": 10, "window_s": 0.1}, "window_s must be seconds"),
    ({"latency_ms": 10, "window_s": 1, "probe_interval_ms": 500}, "at least 5 probes"),
    ({"latency_ms": 10, "hold_down_s": -1}, "hold_down_s"),
])
def test_bad_bounds_are_one_error_naming_the_field(kwargs, words):
    with pytest.raises(ClientError, match="move_on: ") as info:
        MoveBounds(**kwargs)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_connect_wants_a_standby_and_a_move_bounds():
    from appliance.client import connect

    with pytest.raises(ClientError, match="move_on needs a standby"):
        connect("udp://127.0.0.1:9", "x", move_on=MoveBounds(latency_ms=10))
    with pytest.raises(ClientError, match="move_on takes a MoveBounds"):
        connect("udp://127.0.0.1:9", "x", standby="udp://127.0.0.2:9",
                move_on={"latency_ms": 10})


def _args(**kw) -> argparse.Namespace:
    base = dict(command_name="sub", standby="10.0.0.2:47471", move_latency_ms=None,
                move_jitter_ms=None, move_loss=None, move_window=None, move_hold_down=None)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(("kw", "words"), [
    ({"move_loss": 0.0}, "--move-loss is a percentage above 0 and below 100, not 0"),
    ({"move_loss": 150.0}, "--move-loss is a percentage"),
    ({"move_latency_ms": -5.0}, "--move-latency-ms must be milliseconds"),
    ({"move_jitter_ms": float("inf")}, "--move-jitter-ms must be milliseconds"),
    ({"move_latency_ms": 50.0, "move_window": 0.1}, "--move-window must be seconds"),
    ({"move_window": 3.0}, "give at least one of --move-latency-ms, --move-loss"),
    ({"move_latency_ms": 50.0, "standby": None}, "need --standby"),
])
def test_cli_bad_move_options_are_one_line_naming_the_option(kw, words):
    from appliance.ops.cli.pubsub_cmd import _move_bounds

    with pytest.raises(UserError) as info:
        _move_bounds(_args(**kw))
    assert words in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_cli_move_options_make_the_bounds():
    from appliance.ops.cli.pubsub_cmd import _move_bounds

    assert _move_bounds(_args()) is None
    assert _move_bounds(_args(standby=None)) is None
    bounds = _move_bounds(_args(move_latency_ms=100.0, move_loss=25.0, move_window=2.0))
    assert bounds == MoveBounds(latency_ms=100.0, loss_ratio=0.25, window_s=2.0)
