"""/metrics of a real running appliance (``topicwire run``) checked as Prometheus' own lint
would (tests/appliance/promlint.py): it parses with prometheus_client's text parser, names
carry units and counters ``_total``, latency and frame sizes are histograms, process_* and
build info are there; and a hostile client that floods it with identities, sessions and
patterns cannot grow the number of series: none of what it chose shows up as a label."""

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from appliance.client import ClientError, connect
from appliance.ops.mgmt.config import METRICS_LATENCY_BUCKETS_S
from appliance.ops.mgmt.metrics import (
    MESSAGE_VERDICTS,
    METRIC_NAMES,
    OFFLOAD_COUNTERS,
    _hdr_index_values,
    latency_buckets,
)
from channels.stats import LATENCY_HIGHEST_NS, LATENCY_LOWEST_NS, LATENCY_SIGNIFICANT_DIGITS
from tests.appliance.helpers import free_port, run_appliance, stop, wait_for
from tests.appliance.mgmt_fabric import http
from tests.appliance.promlint import lint, series

EVENTS = "topicwire_events_total"


def test_every_software_nic_counter_has_its_metric():
    """A verdict or counter the NIC gains cannot go unexported (its malformed frames are
    ``topicwire_offload_malformed_frames_total`` by reason)."""
    from nic_offload.softnic import layout as L

    assert set(MESSAGE_VERDICTS) == {v.name.lower() for v in L.MessageVerdict
                                     if v is not L.MessageVerdict.NOT_PROCESSED}
    assert set(OFFLOAD_COUNTERS) | {"malformed_frames"} == {c.name.lower() for c in L.Counter}


def test_hdr_index_values_are_the_histograms_own():
    h = HdrHistogram(LATENCY_LOWEST_NS, LATENCY_HIGHEST_NS, LATENCY_SIGNIFICANT_DIGITS)
    lowest, middle = _hdr_index_values(h.counts_len, h.sub_bucket_half_count_magnitude,
                                       h.unit_magnitude)
    for i in range(h.counts_len):
        value = h.get_value_from_index(i)
        assert lowest[i] == value, i
        assert middle[i] == (h.get_lowest_equivalent_value(value)
                             + h.get_highest_equivalent_value(value)) / 2, i


def test_latency_buckets_count_what_was_recorded_below_each_bound():
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.integers(1, 2_000, 300), rng.integers(2_000, 10**6, 300),
                             rng.integers(10**6, 20 * 10**9, 300)])
    h = HdrHistogram(LATENCY_LOWEST_NS, LATENCY_HIGHEST_NS, LATENCY_SIGNIFICANT_DIGITS)
    for v in values:
        h.record_value(int(v))
    buckets, total_s = latency_buckets(h)
    assert buckets[-1] == ("+Inf", float(len(values)))
    for (le, count), bound in zip(buckets, METRICS_LATENCY_BUCKETS_S):
        exact = int(np.count_nonzero(values <= bound * 1e9))
        # an HdrHistogram sub-bucket straddling the bound counts whole: 0.1 % resolution
        near = int(np.count_nonzero(np.abs(values - bound * 1e9) <= bound * 1e9 * 1e-3 + 1))
        assert abs(count - exact) <= near, (le, count, exact)
    assert abs(total_s - values.sum() / 1e9) <= values.sum() / 1e9 * 1e-3


@pytest.fixture(scope="module")
def appliance(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lint")
    clients, mgmt = free_port(), free_port()
    config = tmp / "lint.toml"
    config.write_text(
        f'[appliance]\nname = "lint"\n[fabric]\nlisten = "127.0.0.1:{free_port()}"\n'
        f'[clients]\nudp = "127.0.0.1:{clients}"\n'
        '[pm]\nmode = "embedded"\nrequire_passwords = false\nanonymous = false\n'
        '[pm.identities.feed]\npublish = ["p/#"]\nsubscribe = ["p/#"]\n'
        f'[mgmt]\nlisten = "127.0.0.1:{mgmt}"\n')
    proc = run_appliance(config)
    try:
        yield f"udp://127.0.0.1:{clients}", f"http://127.0.0.1:{mgmt}"
    finally:
        assert stop(proc) == 0


def scrape(base):
    code, headers, text = http("GET", base + "/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return text


def flood(url, tag, n, feed):
    """What a hostile client chooses: n identities that are refused at login, n sessions of
    the identity it has, n topic patterns it may subscribe to and n it may not."""
    chosen = set()
    for i in range(n):
        identity = f"intruder-{tag}-{i}"
        chosen.add(identity)
        with pytest.raises(ClientError):
            connect(url, identity).close()
    for _ in range(n):
        client = connect(url, "feed")
        chosen.add(str(client.session))
        client.close()
    for i in range(n):
        allowed, denied = f"p/{tag}/{i}", f"q/{tag}/{i}"
        chosen |= {allowed, denied}
        feed.subscribe(allowed)
        with pytest.raises(ClientError):
            feed.subscribe(denied)
    return chosen


def test_a_live_scrape_passes_the_lint_and_a_flood_of_client_names_adds_no_series(appliance):
    url, base = appliance
    feed = connect(url, "feed")
    try:
        sub = feed.subscribe("p/data")
        for i in range(20):
            feed.publish("p/data", b"x" * (16 + 100 * i))
        feed.flush()
        for _ in range(20):
            assert sub.get(timeout=10) is not None
        first = flood(url, "a", 5, feed)
        wait_for(lambda: len(http("GET", base + "/denials")[2]["denials"]) >= 10)

        def sizes_of(text: str) -> dict[str, float]:
            return {dict(labels)["le"]: v for name, labels in series(text)
                    if name == "topicwire_channel_received_frame_size_bytes_bucket"
                    and dict(labels)["channel"] == "clients-udp"
                    for v in [_value(text, name, labels)]}

        # the channels' figures come with the data path's counters (every 250 ms)
        def counted() -> str | None:
            text = scrape(base)
            return text if sizes_of(text).get("1024.0") else None

        text = wait_for(counted, what="the client's frames in the size histogram")
        assert lint(text) == []
        before = series(text)
        names = {name for name, _ in before}
        assert {n for n in names if n.startswith("topicwire_")} <= set(METRIC_NAMES)
        assert {"topicwire_build_info", "topicwire_channel_latency_seconds_bucket",
                "topicwire_channel_received_frame_size_bytes_bucket",
                "process_cpu_seconds_total", "process_resident_memory_bytes",
                "process_open_fds", "process_start_time_seconds"} <= names
        # the client's frames are counted in the size histogram's buckets (UDP: below 64 KiB)
        sizes = sizes_of(text)
        assert sizes["+Inf"] > sizes["1024.0"] > 0 and sizes["65536.0"] == sizes["+Inf"]

        second = flood(url, "b", 40, feed)
        def settled():  # the status snapshot holds every allowed pattern and every denial
            status = http("GET", base + "/status")[2]
            return (len(status["subscriptions"]) >= 46
                    and status["counters"].get("control_denials", 0) >= 90)
        wait_for(settled)
        text = scrape(base)
        assert lint(text) == []
        after = series(text)
        # no series appeared but the named counters' (their names are the code's own)
        assert {s for s in after if s[0] != EVENTS} == {s for s in before if s[0] != EVENTS}
        events = {dict(labels)["counter"] for name, labels in after if name == EVENTS}
        assert all(e.replace("_", "").isalnum() and e.islower() for e in events)
        assert len(events) < 200
        values = {v for _, labels in after for _, v in labels}
        assert not (first | second) & values  # nothing a client chose is a label value
        denied = {dict(labels)["action"]: _value(text, name, labels) for name, labels in after
                  if name == "topicwire_entitlement_denials_total"}
        assert denied["login"] == 45 and denied["subscribe"] == 45
    finally:
        feed.close()


def _value(text, name, labels):
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and tuple(sorted(s.labels.items())) == labels:
                return s.value
    raise KeyError((name, labels))
