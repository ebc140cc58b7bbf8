"""The outcomes of guaranteed messages, in memory: the tracker's rules, and the client's
reliable sender failing the outcomes of what it can no longer retransmit.

The end-to-end behaviour (appliances acknowledging, killed, restarted) is
tests/appliance/test_client_state.py.
"""

from __future__ import annotations

import threading

import pytest

from appliance.client.errors import PublishFailedError
from appliance.client.guaranteed import _ClientSender
from appliance.client.outcomes import Outcome, OutcomeTracker
from datapath.protocol.admin_layout import SeqRange
from datapath.protocol.frame_layout import FrameType
from datapath.reliability import SenderConfig
from datapath.reliability.wire import admin_frames


def _track(tracker: OutcomeTracker, n: int, callback=None) -> list[Outcome]:
    outcomes = [Outcome(tracker, seq, "g/t") for seq in range(1, n + 1)]
    for o in outcomes:
        tracker.add(o, callback)
    return outcomes


def test_an_acknowledgement_resolves_every_outcome_up_to_it_and_no_further():
    tracker = OutcomeTracker()
    outcomes = _track(tracker, 10)
    tracker.acknowledge_upto(6)
    assert [o.acknowledged for o in outcomes] == [True] * 6 + [False] * 4
    assert tracker.unacknowledged() == 4 and tracker.acknowledged == 6
    tracker.acknowledge_upto(3)  # an older ACK changes nothing
    assert tracker.unacknowledged() == 4


def test_a_failed_range_stays_failed_when_the_acknowledgement_passes_it():
    tracker = OutcomeTracker()
    outcomes = _track(tracker, 5)
    assert tracker.fail_range(2, 3, "refused (gone)") == 2
    tracker.acknowledge_upto(5)
    assert [o.state for o in outcomes] == ["acknowledged", "failed", "failed", "acknowledged",
                                           "acknowledged"]
    with pytest.raises(PublishFailedError, match="not acknowledged: refused") as raised:
        outcomes[1].result(timeout=0)
    assert raised.value.reason == "refused (gone)"
    assert tracker.take_unreported() == {"refused (gone)": 2}
    assert tracker.take_unreported() == {}  # reported once


def test_callbacks_run_once_when_resolved_and_at_once_when_already_resolved():
    tracker = OutcomeTracker()
    calls: list[tuple[int, str]] = []
    outcomes = _track(tracker, 3, lambda o: calls.append((o.sequence, o.state)))
    tracker.acknowledge_upto(1)
    tracker.fail_all("appliance lost (test)")
    tracker.acknowledge_upto(3)  # after the failure: nothing more
    outcomes[0].add_done_callback(lambda o: calls.append((o.sequence, "late")))
    assert calls == [(1, "acknowledged"), (2, "failed"), (3, "failed"), (1, "late")]


def test_a_raising_callback_does_not_stop_the_others():
    tracker = OutcomeTracker()
    seen = []

    def bad(_: Outcome) -> None:
        raise RuntimeError("application bug")

    _track(tracker, 2, bad)
    tracker.acknowledge_upto(2)  # logged, not raised
    o = Outcome(tracker, 3, "g/t")
    tracker.add(o, seen.append)
    tracker.acknowledge_upto(3)
    assert seen == [o]


def test_wait_all_returns_when_another_thread_acknowledges():
    tracker = OutcomeTracker()
    outcomes = _track(tracker, 100)
    thread = threading.Thread(target=tracker.acknowledge_upto, args=(100,))
    thread.start()
    assert tracker.wait_all(60.0) == 0
    thread.join()
    assert all(o.result(timeout=0) == o.sequence for o in outcomes)


def test_result_times_out_while_pending():
    tracker = OutcomeTracker()
    (outcome,) = _track(tracker, 1)
    with pytest.raises(TimeoutError, match="not acknowledged within 0 s"):
        outcome.result(timeout=0)


class _FakeClient:
    """What ``_ClientSender`` uses of a client: its outcomes and its raw send."""

    def __init__(self) -> None:
        self._outcomes = OutcomeTracker()
        self.sent: list[bytes] = []

    def _send_raw(self, frame: memoryview) -> None:
        self.sent.append(bytes(frame))


def test_what_the_sender_no_longer_holds_when_asked_again_fails_as_refused():
    client = _FakeClient()
    sender = _ClientSender(client, session_id=7, stream_id=7 | (1 << 31),
                           config=SenderConfig(retransmit_buffer_messages=2))
    outcomes = []
    for i in range(6):
        assert sender.offer(1, b"m%d" % i, 0)
        sender.flush(0)  # one frame per message: the buffer keeps the last two
        outcomes.append(Outcome(client._outcomes, sender.next_seq - 1, "g/t"))
        client._outcomes.add(outcomes[-1], None)
    (nak,) = admin_frames(FrameType.NAK, [SeqRange(1, 6)], 64, source_session=99,
                          dest_session=7, stream_id=7 | (1 << 31))
    assert sender.on_frame(memoryview(nak), 1)
    failed = [o for o in outcomes if o.done()]
    assert [o.sequence for o in failed] == [1, 2, 3, 4]
    assert all(o.reason.startswith("refused (no longer in the client's retransmission")
               for o in failed)
    assert not outcomes[4].done() and not outcomes[5].done()  # retransmitted instead
    assert client.sent  # the LOSS and RETRANSMISSION frames went to the appliance
