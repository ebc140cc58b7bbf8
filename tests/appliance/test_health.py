"""``/healthz`` and ``/readyz``: what a probe (systemd, an orchestrator) asks, without a token."""

from __future__ import annotations

from appliance.config import parse_config
from appliance.node import Appliance
from tests.appliance.helpers import FABRIC_KEY, free_port, wait_for
from tests.appliance.mgmt_fabric import http


def _appliance(pm: dict, neighbours: list | None = None) -> tuple[Appliance, str]:
    mgmt = free_port()
    app = Appliance(parse_config({
        "appliance": {"name": f"health{mgmt}"},
        "fabric": {"listen": f"127.0.0.1:{free_port()}", "key": FABRIC_KEY},
        "neighbours": neighbours or [], "pm": pm,
        "mgmt": {"listen": f"127.0.0.1:{mgmt}", "token": "health-token-0123456789"}})).start()
    return app, f"http://127.0.0.1:{mgmt}"


def test_an_appliance_with_its_pm_document_is_live_and_ready() -> None:
    app, url = _appliance({"anonymous": True, "require_passwords": False})
    try:
        assert http("GET", url + "/healthz")[::2] == (200, {"status": "ok"})
        wait_for(lambda: http("GET", url + "/readyz")[0] == 200)
        assert http("GET", url + "/readyz")[2] == {"status": "ready"}
        assert http("POST", url + "/healthz")[0] == 405
    finally:
        app.stop()


def test_without_pm_the_appliance_is_live_but_not_ready() -> None:
    # P&M is remote and its neighbour never answers: logins would be refused
    app, url = _appliance({"mode": "remote"},
                          [{"name": "nobody", "address": f"127.0.0.1:{free_port()}"}])
    try:
        assert http("GET", url + "/healthz")[0] == 200
        code, _, body = http("GET", url + "/readyz")
        assert code == 503 and body["status"] == "not ready"
        assert any("P&M" in reason for reason in body["reasons"])
    finally:
        app.stop()
