"""Requests to an appliance's management API (``topicwire status``, ``topicwire shutdown``,
``topicwire move-clients``, ``topicwire image boot``): one JSON request, and the commands
on it."""

from __future__ import annotations

import json
from typing import Any


def error_text(exc: Any) -> str:
    """The ``error`` of an HTTP error answer's JSON body, else its reason."""
    try:
        return str(json.loads(exc.read()).get("error", exc.reason))
    except Exception:  # no JSON body: the HTTP reason says what there is to say
        return str(exc.reason)


def request_json(url: str, path: str, token: str | None, timeout_s: float, tls: Any = None,
                 *, body: dict | None = None, component: str = "status",
                 refused: str = "request") -> Any:
    """GET ``url + path`` (POST ``body`` when given) as JSON (``tls``: the context of an
    https URL); StatusUsageError (the token refused: "refused the ``refused``") /
    StatusUnreachable (not reached, not HTTP, not JSON) naming ``component`` when it
    fails."""
    import http.client
    import urllib.error
    import urllib.request

    from appliance.ops.mgmt.errors import StatusUnreachable, StatusUsageError

    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url + path, data=data, headers=headers,
                                     method="GET" if body is None else "POST")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=tls) as answer:
            raw = answer.read()
    except urllib.error.HTTPError as exc:
        detail = error_text(exc)
        if exc.code in (401, 403):
            raise StatusUsageError(f"{url} refused the {refused} ({exc.code}): {detail}; pass "
                                   "the appliance's mgmt.token with --token",
                                   component=component) from None
        raise StatusUnreachable(f"{url}{path} answered {exc.code}: {detail}; is this a "
                                "topicwire management API?", component=component) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatusUnreachable(f"cannot reach the management API at {url} ({reason}); is "
                                "the appliance running with mgmt.listen set to that address? "
                                "Point --mgmt at it", component=component) from None
    except http.client.HTTPException as exc:  # not HTTP at all, or cut short
        raise StatusUnreachable(f"{url}{path} did not answer HTTP ({type(exc).__name__}); is "
                                "this a topicwire management API?",
                                component=component) from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise StatusUnreachable(f"{url}{path} did not answer JSON; is this a topicwire "
                                "management API?", component=component) from None


def post_shutdown(url: str, token: str | None, reason: str, timeout_s: float,
                  tls: Any = None) -> dict[str, Any]:
    """``POST url/shutdown``; the answer's JSON. StatusUsageError (token refused) /
    StatusUnreachable (not reached, refused, not a topicwire API) when it fails."""
    from appliance.ops.mgmt.errors import StatusUnreachable

    doc = request_json(url, "/shutdown", token, timeout_s, tls,
                       body={"reason": reason} if reason else {}, component="shutdown",
                       refused="command")
    if not isinstance(doc, dict) or not doc.get("ok"):
        raise StatusUnreachable(f"{url}/shutdown did not answer like a topicwire "
                                "management API", component="shutdown")
    return doc


def post_move_clients(url: str, token: str | None, body: dict[str, Any], timeout_s: float,
                      tls: Any = None) -> dict[str, Any]:
    """``POST url/clients/move`` with ``body`` ({"all": true} | {"identity"} | {"sessions"},
    and "reason"); the answer's JSON (``asked``, ``not_movable``, ``unknown``). Errors as
    ``post_shutdown``'s."""
    from appliance.ops.mgmt.errors import StatusUnreachable

    doc = request_json(url, "/clients/move", token, timeout_s, tls, body=body,
                       component="move-clients", refused="command")
    if not isinstance(doc, dict) or not doc.get("ok"):
        raise StatusUnreachable(f"{url}/clients/move did not answer like a topicwire "
                                "management API", component="move-clients")
    return doc
