"""The client API's errors: what a wrong call gets (one exported base, a message saying what
is accepted), and ``connect`` taking what the command line takes."""

from __future__ import annotations

import pytest

from appliance.client import ClientError, TopicwireError, connect
from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import free_port


@pytest.fixture(scope="module")
def port():
    port = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"apierr{port}"},
        "fabric": {"listen": f"127.0.0.1:{free_port()}", "key": "55" * 32},
        "clients": {"udp": f"127.0.0.1:{port}"},
        "pm": {"anonymous": True, "require_passwords": False}})).start()
    try:
        yield port
    finally:
        app.stop()


def test_connect_takes_host_port_as_the_command_line_does(port) -> None:
    with connect(f"127.0.0.1:{port}") as client:
        sub = client.subscribe("api/#")
        client.publish("api/x", b"1", flush=True)
        assert sub.get(timeout=10).payload == b"1"


def test_publish_after_close_raises_instead_of_dropping(port) -> None:
    client = connect(f"udp://127.0.0.1:{port}")
    client.publish("api/y", b"before", flush=True)
    client.close()
    with pytest.raises(ClientError, match="publish on a closed client"):
        client.publish("api/y", b"after")


def test_a_text_payload_is_refused_with_what_to_do(port) -> None:
    with connect(f"udp://127.0.0.1:{port}") as client:
        with pytest.raises(ClientError, match=r"bytes, bytearray or memoryview, not str "
                                              r"\(encode text first"):
            client.publish("api/z", "text")  # type: ignore[arg-type]
        with pytest.raises(ClientError, match="not int"):
            client.publish("api/z", 5)  # type: ignore[arg-type]


def test_every_client_error_is_a_topicwire_error() -> None:
    with pytest.raises(TopicwireError):
        connect(1234)  # type: ignore[arg-type]
    with pytest.raises(TopicwireError, match="give shm://RING"):
        connect("ftp://somewhere")
