"""The same MQTT scenarios against the edge and against mosquitto, the reference: what a
client sees must agree, except the differences docs/mqtt.md names as deliberate (each is
asserted here per broker, so a change on either side shows)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.appliance.helpers import free_port
from tests.edge.conftest import DEADLINE_S, PASSWORDS, start_edge, wait_for
from tests.edge.peers import Peer

MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
pytestmark = pytest.mark.skipif(MOSQUITTO is None or shutil.which("mosquitto_passwd") is None,
                                reason="mosquitto is not installed (make test installs it: "
                                       "APT_PACKAGES)")


class Mosquitto:
    """mosquitto on a free loopback port with the edge tests' identities: passwords, and
    ACLs equal to their P&M entitlements (persistence off)."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        passwd = directory / "passwd"
        passwd.touch()
        for user, password in PASSWORDS.items():
            subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, password], check=True,
                           capture_output=True)
        acl = directory / "acl"
        acl.write_text("user alice\ntopic readwrite #\ntopic readwrite $SYS/#\n"
                       "user bob\ntopic readwrite bob/#\ntopic readwrite public/#\n")
        conf = directory / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous false\n"
                        f"password_file {passwd}\nacl_file {acl}\npersistence false\n"
                        "log_dest stderr\nuser root\n")  # root: read this test's files
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"mosquitto did not start: {self.proc.stderr.read()}")\
                        from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(DEADLINE_S)


@pytest.fixture(params=["edge", "mosquitto"])
def broker(request, tmp_path) -> Iterator[Any]:
    if request.param == "edge":
        b = start_edge()
        b.name = "edge"
        yield b
        b.stop()
    else:
        b = Mosquitto(tmp_path)
        b.name = "mosquitto"
        yield b
        b.stop()


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_delivered_qos_for_each_publish_and_subscription_qos(broker, version):
    # MQTT: min(publish, granted), on both (the edge carries the publish QoS in the native
    # message's headers, docs/mqtt.md "QoS")
    with Peer(broker, "r-sub", version=version) as sub, \
            Peer(broker, "r-pub", version=version) as pub:
        for sub_qos in (0, 1, 2):
            assert sub.subscribe(f"m/{sub_qos}/#", sub_qos) == sub_qos
        for sub_qos in (0, 1, 2):
            for pub_qos in (0, 1, 2):
                pub.publish(f"m/{sub_qos}/{pub_qos}", b"x", pub_qos)
                msg = sub.next()
                assert (msg.topic, msg.qos) == (f"m/{sub_qos}/{pub_qos}", min(pub_qos, sub_qos))


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_refusals_agree(broker, version):
    peer = Peer(broker, "r-bad", password="wrong", version=version)
    peer.client.loop_stop()
    # a wrong password: the edge says "bad user name or password" (3.1.1: 4, 5.0: 0x86),
    # mosquitto 2.0 "not authorized" (5 / 0x87); both are MQTT's, the edge's is the specific one
    assert peer.rc.value == (0x86 if broker.name == "edge" else 0x87)
    with Peer(broker, "r-bob", user="bob", version=version) as bob:
        code = bob.subscribe("alice/#", 1)
        # mosquitto grants a subscription its ACL does not allow (and delivers nothing);
        # the edge refuses it with 0x80 / 0x87 (P&M's entitlement check)
        if broker.name == "edge":
            assert code == (0x80 if version == 4 else 0x87)
        else:
            assert code == 1
        assert bob.subscribe("bob/#", 1) == 1


def test_retained_will_dollar_and_overlapping_unsubscribe_agree(broker):
    with Peer(broker, "r-watch") as watch, Peer(broker, "r-pub2") as pub:
        pub.publish("r/kept", b"v", 1, retain=True)
        assert watch.subscribe("#", 1) == 1
        msg = watch.next()
        assert (msg.topic, msg.payload, msg.retain) == ("r/kept", b"v", True)
        assert watch.subscribe("r/a", 1) == 1
        watch.unsubscribe("r/a")            # "#" still holds r/a
        pub.publish("$SYS/x", b"no", 1)     # not matched by "#"
        pub.publish("r/a", b"yes", 1)
        msg = watch.next()
        assert (msg.topic, msg.payload) == ("r/a", b"yes")
        dying = Peer(broker, "r-dying", will=("r/will", b"bye", 1, False))
        dying.client.loop_stop()
        dying.client.socket().close()
        msg = watch.next()
        assert (msg.topic, msg.payload) == ("r/will", b"bye")
        pub.publish("r/kept", b"", 1, retain=True)  # clear
        msg = watch.next()
        assert (msg.topic, msg.payload) == ("r/kept", b"")  # the clear itself is delivered


def _gone(broker: Any, peer: Peer) -> None:
    """``peer`` disconnects; on the edge, wait until its session is offline (mosquitto
    handles the DISCONNECT before the next connection's packets: one thread)."""
    peer.close()
    if broker.name == "edge":
        wait_for(lambda: broker.mqtt.status()["sessions_offline"] >= 1)


@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_persistent_sessions_agree(broker, version):
    props = None
    if version == 5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 300
    first = Peer(broker, "r-keep", version=version, clean=False, props=props)
    assert not first.session_present and first.subscribe("p/#", 1) == 1
    _gone(broker, first)
    with Peer(broker, "r-ppub", version=version) as pub:
        pub.publish("p/1", b"queued", 1)
        pub.publish("p/0", b"qos0", 0)
        pub.publish("p/2", b"queued too", 2)
    with Peer(broker, "r-keep", version=version, clean=False, props=props) as again:
        assert again.session_present
        got = [(m.topic, m.payload, m.qos) for m in (again.next(), again.next())]
        # both drop QoS 0 for an absent client (mosquitto: queue_qos0_messages false);
        # QoS 2 publish to a QoS 1 subscription: 1 on both (min)
        assert got == [("p/1", b"queued", 1), ("p/2", b"queued too", 1)]
    with Peer(broker, "r-keep", version=version) as clean:   # clean: the session goes
        assert not clean.session_present


def test_shared_subscriptions_and_5_0_properties_agree(broker):
    with Peer(broker, "r-m1", version=5) as m1, Peer(broker, "r-m2", version=5) as m2, \
            Peer(broker, "r-spub", version=5) as pub:
        assert m1.subscribe("$share/g/s/#", 1) == 1 and m2.subscribe("$share/g/s/#", 1) == 1
        for i in range(4):
            pub.publish(f"s/{i}", str(i).encode(), 1)
        one = sorted(m1.next().payload for _ in range(2))
        two = sorted(m2.next().payload for _ in range(2))
        assert sorted(one + two) == [b"0", b"1", b"2", b"3"]   # each once, 2 each
        sent = Properties(PacketTypes.PUBLISH)
        sent.ResponseTopic, sent.CorrelationData = "s/reply", b"42"
        sent.UserProperty = [("k", "v")]
        sid = Properties(PacketTypes.SUBSCRIBE)
        sid.SubscriptionIdentifier = 5
        assert m1.subscribe("rr/#", 1, props=sid) == 1
        pub.publish("rr/q", b"?", 1, props=sent)
        got = m1.next().properties
        assert (got.ResponseTopic, got.CorrelationData, got.UserProperty,
                got.SubscriptionIdentifier) == ("s/reply", b"42", [("k", "v")], [5])
