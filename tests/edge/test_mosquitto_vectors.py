"""mosquitto's byte-level conformance vectors (tests/edge/mosquitto_vectors.py) against one
real edge appliance, 3.1.1 and 5.0: one case per vector, each verdict compared with
``mosquitto_vectors_expected.txt`` (a case that starts passing must be marked so there, one
that stops passing fails). Skipped only when mosquitto's source package cannot be fetched."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator

import pytest

from appliance.config import parse_config
from appliance.edge.node import EdgeAppliance
from tests.edge import mosquitto_vectors as mv
from tests.edge.conftest import edge_doc
from tests.edge.peers import Peer

EXPECTED = mv.read_expected()
WARM_UP_DEADLINE_S = 600.0


def start_vector_edge() -> EdgeAppliance:
    """An edge as mosquitto's vectors expect a broker: anonymous clients allowed (entitled to
    every topic), mosquitto's default limits where they show in a CONNACK (Receive Maximum 20,
    Topic Alias Maximum 10)."""
    doc = edge_doc(allow_anonymous=True, max_inflight=20, topic_alias_maximum=10)
    doc["pm"]["identities"]["anonymous"] = {"publish": ["#"], "subscribe": ["#"]}
    return EdgeAppliance(parse_config(doc)).start()


def warm_up(edge: EdgeAppliance) -> None:
    """One exchange of each kind before the first case (paho, 3.1.1 and 5.0, QoS 0, 1 and 2
    both ways). An edge compiles some kernels on first use: the first case once outlasted its
    deadline, and with a cold numba cache (no ``topicwire warm``) logins are refused as
    "server unavailable" for minutes; the warm-up retries them up to ``WARM_UP_DEADLINE_S``."""
    deadline = time.monotonic() + WARM_UP_DEADLINE_S
    for version in (4, 5):
        while True:
            try:
                peer = Peer(edge, f"warm-up-{version}", user=None, version=version)
            except queue.Empty:  # no CONNACK within the edge tests' deadline
                peer = None
            if peer is not None and peer.rc == 0:
                break
            if peer is not None:
                peer.close()
            assert time.monotonic() < deadline, f"the edge refused logins for " \
                f"{WARM_UP_DEADLINE_S:g} s (rc {peer and peer.rc})"
            time.sleep(1.0)
        with peer:
            peer.subscribe("warm-up", 2)
            for qos in (0, 1, 2):
                peer.publish("warm-up", b"w", qos)
                peer.next()


@pytest.fixture(scope="module")
def vectors() -> tuple[mv.Runner, dict[str, mv.Case]]:
    try:
        tests = mv.fetch()
    except mv.VectorsUnavailable as e:
        pytest.skip(f"{e} (mosquitto's source package could not be fetched; "
                    "the vectors did not run)")
    return tests, {c.cid: c for c in mv.load_cases(tests)}


@pytest.fixture(scope="module")
def runner(vectors) -> Iterator[mv.Runner]:
    edge = start_vector_edge()
    try:
        warm_up(edge)
        yield mv.Runner(vectors[0], "127.0.0.1", edge.mqtt.address[1])
    finally:
        edge.stop()


def test_the_list_names_every_vector_of_the_package(vectors) -> None:
    cases = vectors[1]
    assert sorted(set(cases) - set(EXPECTED)) == [], "vectors missing from the list"
    assert sorted(set(EXPECTED) - set(cases)) == [], "listed cases the package does not have"
    assert list(cases) == list(EXPECTED), "the list is not in the package's order"


@pytest.mark.parametrize("cid", list(EXPECTED))
def test_vector(cid: str, vectors, runner: mv.Runner) -> None:
    case = vectors[1].get(cid)
    if case is None:
        pytest.fail(f"{cid}: not a case of mosquitto {mv.SOURCE_VERSION}'s vectors")
    why = runner.run(case)
    expected = EXPECTED[cid]
    if expected == "pass":
        assert why is None, f"{cid}: listed as passing, now fails: {why}"
    else:
        assert why is not None, (f"{cid}: now passes; mark it 'pass' in "
                                 f"mosquitto_vectors_expected.txt (was: {expected})")
