"""Appliances with the management API on loopback, and a real HTTP client, for the mgmt tests.

``Triangle(tmp)`` starts three ``topicwire run`` processes (m1 the embedded P&M with a
management token, m2 with the API but no token, m3 without the API), all neighbours of each
other on 127.0.0.1, and waits until every one has a route to every other.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.appliance.helpers import FABRIC_KEY, free_port, run_appliance, stop, wait_for

TOKEN = "mgmt-test-token-0123456789"
STATUS_CLI = [sys.executable, "-c",
              "import sys, appliance.ops.cli as c; m = 'appliance.ops.cli.status_cmd'; "
              "c.COMMAND_MODULES = tuple(c.COMMAND_MODULES) + "
              "(() if m in c.COMMAND_MODULES else (m,)); sys.exit(c.main(sys.argv[1:]))"]
"""``topicwire`` with the status command registered (until the CLI lists it)."""


def http(method: str, url: str, body: object = None, token: str | None = None,
         raw: bytes | None = None, headers: dict | None = None, timeout_s: float = 10.0
         ) -> tuple[int, dict, object]:
    """One real HTTP request: (status, headers, JSON body or text)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            status, hdrs, payload = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        status, hdrs, payload = exc.code, dict(exc.headers), exc.read()
    text = payload.decode()
    if hdrs.get("Content-Type", "").startswith("application/json"):
        return status, hdrs, json.loads(text)
    return status, hdrs, text


class Triangle:
    """See the module docstring. ``mgmt[name]`` is the API's base URL (m1, m2)."""

    NAMES = ("m1", "m2", "m3")

    def __init__(self, tmp: Path, log_format: str = "text") -> None:
        self.fabric = {n: free_port() for n in self.NAMES}
        self.clients = {n: free_port() for n in self.NAMES}
        self.mgmt = {n: f"http://127.0.0.1:{free_port()}" for n in ("m1", "m2")}
        self.procs = {}
        try:
            for name in self.NAMES:
                config = tmp / f"{name}.toml"
                config.write_text(self._config(name, log_format))
                self.procs[name] = run_appliance(config)
            wait_for(self.converged, timeout_s=30)
        except BaseException:
            self.close()
            raise

    def _config(self, name: str, log_format: str) -> str:
        lines = [f'[appliance]\nname = "{name}"\nheartbeat_interval_ms = 50\n'
                 "lsa_refresh_ms = 500",
                 f'[fabric]\nlisten = "127.0.0.1:{self.fabric[name]}"\nkey = "{FABRIC_KEY}"',
                 f'[clients]\nudp = "127.0.0.1:{self.clients[name]}"']
        for other in self.NAMES:
            if other != name:
                lines.append(f'[[neighbours]]\nname = "{other}"\n'
                             f'address = "127.0.0.1:{self.fabric[other]}"')
        if name == "m1":
            lines.append('[pm]\nmode = "embedded"\n'
                         'require_passwords = false\n[pm.identities.feed]\npublish = ["p/#"]\n'
                         'subscribe = ["p/#"]')
            lines.append(f'[mgmt]\nlisten = "{self.mgmt[name][7:]}"\ntoken = "{TOKEN}"')
        else:
            lines.append('[pm]\nmode = "remote"')
            if name == "m2":
                lines.append(f'[mgmt]\nlisten = "{self.mgmt[name][7:]}"')
        lines.append(f'[log]\nformat = "{log_format}"')
        return "\n".join(lines) + "\n"

    def status(self, name: str) -> dict:
        status, _, doc = http("GET", self.mgmt[name] + "/status")
        assert status == 200, doc
        return doc

    def converged(self) -> bool:
        for name in self.mgmt:
            doc = self.status(name)
            if len(doc["routes"]) != 6 or not doc["node"]["pm"]:
                return False
        return True

    def client_url(self, name: str) -> str:
        return f"udp://127.0.0.1:{self.clients[name]}"

    def close(self) -> dict[str, int]:
        return {name: stop(proc) for name, proc in self.procs.items()}
