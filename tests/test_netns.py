"""The namespace fixture builds real hosts that reach each other and nothing else."""

import subprocess
import sys

from tests.netns import Fabric, requires_netns, sh

RECEIVE = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
           "s.bind(('0.0.0.0', 47999)); s.settimeout(5); print(s.recv(100).decode())")
SEND = ("import socket, sys, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "for _ in range(50): s.sendto(b'hello', (sys.argv[1], 47999)); time.sleep(0.02)")


@requires_netns
def test_hosts_on_the_bridge_exchange_udp_and_loss_can_be_injected():
    with Fabric() as fabric:
        a, b = fabric.add_host(), fabric.add_host()
        receiver = b.popen([sys.executable, "-c", RECEIVE], stdout=subprocess.PIPE, text=True)
        a.run(sys.executable, "-c", SEND, b.addresses[0])
        assert receiver.communicate(timeout=10)[0].strip() == "hello"
        fabric.drop_incoming(b, 100.0)
        receiver = b.popen([sys.executable, "-c", RECEIVE], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        a.run(sys.executable, "-c", SEND, b.addresses[0])
        out, err = receiver.communicate(timeout=10)
        assert receiver.returncode != 0 and "timed out" in err
        names = {a.name, b.name, fabric.switch.name}
    assert not names & set(sh("ip", "netns", "list").stdout.split())
