"""The namespace fixture builds real hosts that reach each other and nothing else."""

import re
import subprocess
import sys
import time

from tests.netns import Fabric, requires_netns, sh

RECEIVE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', 47999))
print('READY', flush=True)
if sys.argv[1] == 'wait':  # for the datagram
    s.settimeout(10)
else:  # told when the datagram was handled: is it here?
    sys.stdin.readline()
    s.setblocking(False)
try:
    print(s.recv(100).decode())
except (BlockingIOError, TimeoutError):
    print('NOTHING')
"""
SEND = ("import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.sendto(b'hello', (sys.argv[1], 47999))")


def dropped(host) -> int:
    table = host.run("nft", "list", "table", "inet", "twloss").stdout
    return sum(int(n) for n in re.findall(r"counter packets (\d+)", table))


@requires_netns
def test_hosts_on_the_bridge_exchange_udp_and_loss_can_be_injected():
    with Fabric() as fabric:
        a, b = fabric.add_host(), fabric.add_host()
        receiver = b.popen([sys.executable, "-c", RECEIVE, "wait"], stdout=subprocess.PIPE,
                           text=True)
        assert receiver.stdout.readline().strip() == "READY"
        a.run(sys.executable, "-c", SEND, b.addresses[0])
        assert receiver.communicate(timeout=20)[0].strip() == "hello"
        fabric.drop_incoming(b, 100.0)
        receiver = b.popen([sys.executable, "-c", RECEIVE, "check"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
        assert receiver.stdout.readline().strip() == "READY"
        a.run(sys.executable, "-c", SEND, b.addresses[0])
        deadline = time.monotonic() + 10  # b's firewall counted it: dropped, not delayed
        while dropped(b) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dropped(b) == 1
        assert receiver.communicate("handled\n", timeout=20)[0].strip() == "NOTHING"
        names = {a.name, b.name, fabric.switch.name}
    assert not names & set(sh("ip", "netns", "list").stdout.split())
