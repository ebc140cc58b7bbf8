"""The data path's default idle strategy blocks in poll(2): on the UDP client socket, and on
the doorbell of the shared-memory ring beside it, which a client's publish rings; a command
the control thread offers wakes it; ``appliance.idle_spin_us`` is checked like every key."""

import pytest

from appliance.client import connect
from appliance.config import ConfigError, parse_config
from appliance.node import Appliance
from datapath.agent import PollingIdle
from tests.appliance.helpers import free_port, wait_for


def _config(port: int, **clients):
    return parse_config({"appliance": {"name": f"idle{port}", "dataplane": "thread"},
                         "clients": {"udp": f"127.0.0.1:{port}", **clients},
                         "pm": {"anonymous": True, "require_passwords": False}})


def test_the_default_blocks_on_the_client_socket_and_a_client_is_served():
    port = free_port()
    cfg = _config(port)
    assert cfg.idle == "block"
    with Appliance(cfg) as app:
        idle = app._dp_runner.idle
        assert isinstance(idle, PollingIdle) and idle.spin_ns == cfg.idle_spin_us * 1_000
        fds, complete = app.dataplane.wait_set()
        assert complete and fds == (app.channels["clients-udp"].fileno(),)
        with connect(f"udp://127.0.0.1:{port}", "idle-client") as client:
            sub = client.subscribe("idle/t")
            client.publish("idle/t", b"x")
            client.flush()
            message = sub.get(timeout=10)
            assert message is not None and message.payload == b"x"
        wait_for(lambda: idle.polls > 0)  # idle again: parked in poll


def test_beside_a_shared_memory_ring_the_data_path_sleeps_on_its_doorbell():
    port = free_port()
    ring = f"idle{port}"
    with Appliance(_config(port, shm=ring)) as app:
        fds, complete = app.dataplane.wait_set()
        bus = app.channels["clients-shm"]
        assert complete and fds == (app.channels["clients-udp"].fileno(), bus._bell)
        idle = app._dp_runner.idle
        with connect(f"shm://{ring}", "idle-shm") as client:
            sub = client.subscribe("idle/shm")
            for i in range(3):  # each publish finds the data path asleep in poll
                wait_for(lambda: bus._armed)  # about to poll, or polling, on its doorbell
                rung, woken = client.channel.bells_rung, idle.wakes_ready
                client.publish("idle/shm", bytes([i]))
                client.flush()
                message = sub.get(timeout=10)
                assert message is not None and message.payload == bytes([i])
                assert client.channel.bells_rung > rung  # the publish rang the bell,
                assert idle.wakes_ready > woken  # which ended the data path's poll


def test_a_command_offered_by_the_control_thread_wakes_the_parked_data_path():
    port = free_port()
    with Appliance(_config(port)) as app:
        idle = app._dp_runner.idle
        wait_for(lambda: idle.polls > 0)
        before = idle.wakes_command
        ran = []
        app.dataplane.commands.offer(lambda: ran.append(True))
        wait_for(lambda: ran)
        assert idle.wakes_command > before


@pytest.mark.parametrize("value", [-1, 1_000_001, "fast"])
def test_a_bad_spin_window_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="appliance.idle_spin_us"):
        parse_config({"appliance": {"name": "x", "idle_spin_us": value},
                      "pm": {"anonymous": True, "require_passwords": False}})
