"""Every input in tests/fuzz/corpus replayed: against its decoder, and against a live appliance.

The corpus holds the inputs that crashed something once (the fuzzer saves them:
``python -m tests.fuzz``, tests/fuzz/__init__.py) and the shapes that ended appliances before
(CONTROL documents that are lists or strings). A decoder input must return or raise only the
decoder's documented error. Then one appliance gets every live input, every frame of the
decoder inputs (at both ports) and every document in a CONTROL frame, and afterwards it still
runs, no handler raised, every frame is counted under a reason and a real client is served.
"""

from __future__ import annotations

import json
import random

import pytest

from appliance.control.auth import FabricAuth
from datapath.protocol import admin_layout as al
from datapath.protocol.admin_layout import ControlKind
from datapath.protocol.frame_layout import FrameType
from tests.fuzz import corpus, decoders, live
from tests.fuzz import seeds as S
from tests.fuzz.sender import NEIGHBOUR_EPOCH, NEIGHBOUR_ID

ENTRIES = corpus.entries()
DECODER_ENTRIES = [(p, e) for p, e in ENTRIES if e["target"] != "live"]
LIVE_ENTRIES = [(p, e) for p, e in ENTRIES if e["target"] == "live"]
FRAME_TARGETS = ("decode_frame", "batch", "softnic")


@pytest.fixture(scope="module")
def targets():
    return decoders.targets(decoders.Inputs(random.Random(0)))


def test_the_corpus_holds_frames_documents_and_live_inputs():
    kinds = {e["target"] for _, e in ENTRIES}
    assert {"decode_frame", "document", "live"} <= kinds
    for path, entry in ENTRIES:
        assert path.name == corpus.name_of(entry), f"{path.name}: named by its hash"


@pytest.mark.parametrize("entry", [e for _, e in DECODER_ENTRIES],
                         ids=[p.stem for p, _ in DECODER_ENTRIES])
def test_a_decoder_returns_or_raises_its_documented_error(entry, targets):
    run = targets[entry["target"]][1]
    outcome = run(decoders.item_of(entry))  # a Finding or any other exception fails here
    assert isinstance(outcome, str)


def _frames_of_decoder_entries() -> list[bytes]:
    out: list[bytes] = []
    for _, e in DECODER_ENTRIES:
        if e["target"] in FRAME_TARGETS:
            item = decoders.item_of(e)
            out += item if isinstance(item, list) else [item]
    return out


def _document_frames() -> list[live.Sent]:
    """Each corpus document in a CONTROL frame from who may send it (a client's from the
    logged-in session, a neighbour's signed by the neighbour, others from a stranger)."""
    out: list[live.Sent] = []
    auth = FabricAuth(bytes.fromhex(S.FABRIC_KEY), 1, NEIGHBOUR_EPOCH)
    for _, e in DECODER_ENTRIES:
        if e["target"] != "document":
            continue
        kind, text, sender = decoders.item_of(e)
        try:
            if sender == "neighbour":  # signed again when sent
                frame = S.frame(FrameType.CONTROL, [al.Control(kind, text)],
                                session=NEIGHBOUR_ID, auth=auth)
                out.append(("neighbour", frame, True, 0))
            else:
                frame = S.frame(FrameType.CONTROL, [al.Control(kind, text)], session=1)
                out.append(("session" if sender in (None, "client") else "anon", frame, False, 1))
        except ValueError:  # larger than a frame: the codec refuses to build it
            continue
    return out


def test_a_live_appliance_survives_the_corpus_and_counts_every_frame():
    h = live.fresh_harness()
    try:
        raw = _frames_of_decoder_entries()
        docs = _document_frames()
        plan = {
            "client": [f for _, e in LIVE_ENTRIES if e["port"] == "client"
                       for f in live.frames_of(e)]
            + [("anon", f, False, 0) for f in raw]
            + [d for d in docs if d[0] != "neighbour"],
            "fabric": [f for _, e in LIVE_ENTRIES if e["port"] == "fabric"
                       for f in live.frames_of(e)]
            + [(src, f, False, 0) for f in raw for src in ("neighbour", "stranger")]
            + [d for d in docs if d[0] == "neighbour"],
        }
        for port, frames in plan.items():
            assert frames, f"nothing in the corpus for the {port} port"
            if port == "client" and not h.session_alive():
                h.login(wait_s=10)
            result = live.PortResult(port)
            before = h.settle()
            sent0 = h.sent[port]
            state = live.replay(h, frames)
            after = h.settle()
            result.sent = h.sent[port] - sent0
            result.account(before, after)
            summary = json.dumps(result.as_dict())
            assert state == (0, 0, None), f"{port}: {state}; {summary}"
            assert result.lost == 0 and result.unaccounted == 0, summary
            assert result.received >= len(frames), summary
        assert h.app.failure() is None and h.threads_alive()
        assert h.round_trip() is None
    finally:
        h.close()


def test_every_corpus_document_kind_names_a_control_kind():
    for _, e in DECODER_ENTRIES:
        if e["target"] == "document":
            assert e["kind"] in ControlKind.__members__
