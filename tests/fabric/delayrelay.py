"""A UDP relay that delays one direction, for a test whose kernel has no netem: one client's
path to its appliance made slower, the others' untouched (run inside the client's namespace).

    python -m tests.fabric.delayrelay LISTEN_PORT DEST_HOST DEST_PORT

It listens on 127.0.0.1:LISTEN_PORT; what the client sends there goes on to DEST from a
socket of its own, and what comes back goes to the client. A line ``delay MS`` on standard
input delays what the client sends by MS milliseconds from then on (0: none); it prints
``{"ready": true}`` once listening.
"""

from __future__ import annotations

import heapq
import json
import select
import socket
import sys
import time


def main(argv: list[str]) -> int:
    listen_port, dest = int(argv[0]), (argv[1], int(argv[2]))
    down = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    down.bind(("127.0.0.1", listen_port))
    up = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    up.bind(("0.0.0.0", 0))
    for sock in (down, up):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.setblocking(False)
    client = None
    delay_s = 0.0
    queue: list[tuple[float, int, bytes]] = []
    count = 0
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    while True:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            up.sendto(heapq.heappop(queue)[2], dest)
        timeout = max(0.0, queue[0][0] - now) if queue else 0.05
        readable, _, _ = select.select([down, up, sys.stdin], [], [], min(timeout, 0.05))
        for sock in readable:
            if sock is sys.stdin:
                line = sys.stdin.readline()
                if not line or line.strip() == "quit":
                    return 0
                if line.startswith("delay "):
                    delay_s = float(line.split()[1]) / 1e3
                continue
            while True:
                try:
                    data, peer = sock.recvfrom(65536)
                except BlockingIOError:
                    break
                if sock is down:
                    client = peer
                    if delay_s:
                        count += 1
                        heapq.heappush(queue, (time.monotonic() + delay_s, count, data))
                    else:
                        up.sendto(data, dest)
                elif client is not None:
                    down.sendto(data, client)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
