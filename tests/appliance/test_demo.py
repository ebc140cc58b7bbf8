"""The interim demo delivers exactly what the subscription lists decide, over real UDP."""

import os
import shutil
import socket

import pytest

from appliance.cli import main
from appliance.demo import SUBSCRIBERS, run_demo


def free_udp_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_subscriber_gets_what_a_naive_replay_of_its_requests_says(tmp_path):
    result = run_demo(3000, free_udp_port(), tmp_path, capture=False)
    assert result.sent == result.received == 3000
    assert result.malformed == 0
    assert set(result.delivered) <= set(SUBSCRIBERS)
    assert result.delivered == result.expected
    assert result.expected["everything-then-nothing"] == 0
    assert result.expected["us-desk"] > 0
    assert result.ok


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tcpdump"),
                    reason="capturing on lo needs root and tcpdump")
def test_the_capture_holds_every_message_sent(tmp_path):
    result = run_demo(2000, free_udp_port(), tmp_path, capture=True)
    assert result.captured_messages == result.sent == 2000
    assert (tmp_path / "demo.pcap").stat().st_size > 0
    assert any("topic=" in line for line in result.pcap_lines)


def test_demo_command_exits_0_and_prints_the_table(tmp_path, capsys):
    port = free_udp_port()
    assert main(["demo", "--messages", "500", "--port", str(port), "--out", str(tmp_path),
                 "--no-capture"]) == 0
    out = capsys.readouterr().out
    assert "demo: OK" in out and "nyse-all-but-ibm" in out


def test_demo_refuses_a_port_in_use_with_a_clear_error(tmp_path, capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        assert main(["demo", "--messages", "10", "--port", str(port), "--out", str(tmp_path),
                     "--no-capture"]) == 2
    assert "demo: cannot bind" in capsys.readouterr().err
