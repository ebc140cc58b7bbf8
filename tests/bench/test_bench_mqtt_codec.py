"""bench.mqtt_codec at a tiny size: the report's shape, the kernel and codec.py measured side by
side (the bench refuses to report when they decode differently, or when the compiled
encoders disagree with codec.py)."""

import argparse
import json

import pytest

from bench import mqtt_codec


def _run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    mqtt_codec.add_arguments(parser)
    return json.loads(json.dumps(mqtt_codec.run(parser.parse_args(argv))))


@pytest.mark.parametrize("qos", ["0", "1"])
def test_report_has_the_shared_shape_and_both_decoders_and_encoders(qos):
    report = _run(["--packets", "8", "--rounds", "5", "--repeats", "1", "--qos", qos,
                   "--payload-bytes", "200"])  # (a two-byte remaining length)
    assert list(report) == ["bench", "host", "params", "results", "ratios"]
    assert set(report["results"]) == {"topicwire", "codec.py", "numba"}
    ours = report["results"]["topicwire"]
    assert ours["pkts_per_s"] > 0 and ours["kernel_pkts_per_s"] > 0
    assert report["results"]["codec.py"]["pkts_per_s"] > 0
    assert set(report["ratios"]) == {"pkts_per_s topicwire/codec.py",
                                     "puback_encode_ns topicwire/numba",
                                     "publish_encode_ns topicwire/numba"}
    assert report["params"]["packets"] == 8 and report["params"]["qos"] == int(qos)


def test_a_kernel_that_decodes_differently_is_not_reported(monkeypatch):
    from appliance.edge.mqtt import fastcodec

    def wrong(buf, rows, version, into):  # every PUBLISH's payload lost
        into.extend(p.__class__(p.topic, b"", p.qos, p.retain, p.dup, p.packet_id, [])
                    for p in _decoded(buf, version))
        return -1

    def _decoded(buf, version):
        return mqtt_codec._python_read(bytes(buf), version)

    monkeypatch.setattr(fastcodec, "objects", wrong)
    with pytest.raises(RuntimeError, match="decoded differently"):
        _run(["--packets", "4", "--rounds", "1", "--repeats", "1"])
