"""Channel rows of the status snapshot: percentiles computed from the data path's copied
counts equal hdrh's own, and a sample does not change when the channel goes on counting."""

import numpy as np
import pytest

from appliance.dataplane.status_channels import channel_row, latency_ns_at, sample_channel
from channels.base import FrameBatch
from channels.udp import UdpChannel
from datapath.protocol import admin_layout as al
from datapath.protocol import frame_layout as fl
from datapath.protocol.codec import encode_admin

PERCENTILES = (0, 1, 25, 50, 90, 99, 99.9, 100)


class _Holder:
    """Just enough of a channel for ``sample_channel``: a kind and real ChannelStats."""

    kind = "udp"

    def __init__(self, values):
        from channels.stats import ChannelStats

        self.stats = ChannelStats("held")
        for v in values:
            self.stats.latency.record_value(int(v))


@pytest.mark.parametrize("seed, scale", [(1, 1_000), (2, 200_000), (3, 50_000_000)])
def test_percentiles_of_the_copied_counts_equal_hdrhs_walk(seed, scale):
    rng = np.random.default_rng(seed)
    values = rng.lognormal(0, 1.5, 5_000) * scale + 1
    held = _Holder(values)
    sample = sample_channel("held", held)
    reference = held.stats.latency
    for p in PERCENTILES:
        assert latency_ns_at(sample, p) == reference.get_value_at_percentile(p), p


def test_an_empty_histogram_gives_zero_and_copies_nothing():
    sample = sample_channel("held", _Holder([]))
    assert len(sample.latency_counts) == 0
    assert latency_ns_at(sample, 50) == 0 and channel_row(sample)["p99_us"] == 0.0


def test_a_sample_is_a_copy_the_channel_does_not_change_afterwards():
    held = _Holder([10_000] * 10)
    sample = sample_channel("held", held)
    before = channel_row(sample)
    for _ in range(1_000):
        held.stats.latency.record_value(5_000_000)
    assert channel_row(sample) == before
    assert channel_row(sample_channel("held", held))["p50_us"] > before["p50_us"]


def test_the_row_of_a_real_channel_matches_its_stats():
    frame = encode_admin(fl.FrameType.CONTROL, [al.Control(al.ControlKind.LOGIN, "{}")])
    with UdpChannel(("127.0.0.1", 0)) as rx, UdpChannel(("127.0.0.1", 0)) as tx:
        batch = FrameBatch(8, 512)
        for _ in range(5):
            batch.append(frame)
        assert tx.send(batch, rx.local_address) == 5
        got = FrameBatch(8, 512)
        received = 0
        while received < 5:
            received += rx.receive(got, 1_000_000_000)
        row = channel_row(sample_channel("rx", rx))
        s = rx.stats
        assert row["frames_in"] == s.frames_in == 5 and row["bytes_in"] == s.bytes_in
        assert s.latency.get_total_count() == 5
        assert row["p50_us"] == s.latency_ns_at(50) / 1e3 > 0
        assert row["p99_us"] == s.latency_ns_at(99) / 1e3
        assert row["jitter_us"] == max(s.jitter_by_peer().values()) / 1e3

