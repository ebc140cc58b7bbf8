"""``topicwire run``: starts, serves clients, and drains and exits 0 on SIGTERM/SIGINT."""

import signal

import pytest

from appliance.client import connect
from tests.appliance.helpers import free_port, run_appliance, stop, wait_for


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_serves_clients_then_stops_cleanly_on_a_signal(tmp_path, sig):
    port = free_port()
    config = tmp_path / "a.toml"
    config.write_text(f"""
[appliance]
name = "solo"
[clients]
udp = "127.0.0.1:{port}"
[pm]
anonymous = true
require_passwords = false
""")
    proc = run_appliance(config)
    try:
        # reconnect_s=0: a client told its appliance is going away closes (by default it
        # would try to reconnect: tests/appliance/test_client_state.py)
        with connect(f"udp://127.0.0.1:{port}", "tester", reconnect_s=0) as client:
            sub = client.subscribe("t/#")
            client.publish("t/one", b"payload", flush=True)
            msg = sub.get(timeout=10)
            assert msg is not None and msg.topic == "t/one" and msg.payload == b"payload"
            proc.send_signal(sig)
            assert proc.wait(20) == 0
            # the appliance told its client it was going away
            wait_for(lambda: client.logged_out_reason, timeout_s=5)
            wait_for(lambda: sub.closed, timeout_s=5)  # the subscription ended: empty
            assert client.state == "closed"
            assert sub.get(timeout=0) is None
    finally:
        stop(proc)
    assert proc.returncode == 0
    assert "appliance stopped" in proc.stderr.read()
