"""The host side of test_image_fabric, run inside the test's network namespace (``ip netns
exec``), where the guests' client NICs are on a bridge: wait until the edge has its
neighbour up, then a publisher at the core and a subscriber at the edge exchange messages.
Prints one JSON line ``{"sent", "received", "seconds"}``; exit 0 when all arrived."""

from __future__ import annotations

import json
import sys
import time
import urllib.request

from appliance.client.api import connect


def _neighbours_up(mgmt: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{mgmt}/status", timeout=5) as answer:
            status = json.loads(answer.read())
    except (OSError, ValueError):
        return False
    return any(n.get("state") == "up" for n in status.get("neighbours", []))


def main(core: str, edge: str, count: int, deadline_s: float) -> int:
    deadline = time.monotonic() + deadline_s
    while not (_neighbours_up(f"{edge}:8470") and _neighbours_up(f"{core}:8470")):
        if time.monotonic() > deadline:
            print(json.dumps({"error": "the neighbours did not come up"}))
            return 1
        time.sleep(1.0)
    sub_client = connect(f"udp://{edge}:47471", "desk", timeout_s=20.0)
    pub_client = connect(f"udp://{core}:47471", "feed", timeout_s=20.0)
    started = time.monotonic()
    sent, got = 0, []
    try:
        sub = sub_client.subscribe("img/#")
        while len(got) < count and time.monotonic() < deadline:
            pub_client.publish("img/ticks", f"m{sent}".encode())
            pub_client.flush()
            sent += 1
            message = sub.get(timeout=1.0)
            while message is not None:
                got.append(bytes(message.payload))
                message = sub.get(timeout=0.05)
    finally:
        pub_client.close()
        sub_client.close()
    print(json.dumps({"sent": sent, "received": len(got),
                      "seconds": round(time.monotonic() - started, 1)}), flush=True)
    return 0 if len(got) >= count else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
