"""Requests to an appliance's management API that more than the CLI makes (``topicwire
shutdown``, ``topicwire image boot``): the shutdown command."""

from __future__ import annotations

import json
from typing import Any


def error_text(exc: Any) -> str:
    """The ``error`` of an HTTP error answer's JSON body, else its reason."""
    try:
        return str(json.loads(exc.read()).get("error", exc.reason))
    except Exception:
        return str(exc.reason)


def post_shutdown(url: str, token: str | None, reason: str, timeout_s: float,
                  tls: Any = None) -> dict[str, Any]:
    """``POST url/shutdown``; the answer's JSON. StatusUsageError (token refused) /
    StatusUnreachable (not reached, refused, not a topicwire API) when it fails."""
    import http.client
    import urllib.error
    import urllib.request

    from appliance.ops.mgmt.errors import StatusUnreachable, StatusUsageError

    body = json.dumps({"reason": reason} if reason else {}).encode()
    request = urllib.request.Request(url + "/shutdown", data=body, method="POST", headers={
        "Accept": "application/json", "Content-Type": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=tls) as answer:
            raw = answer.read()
    except urllib.error.HTTPError as exc:
        detail = error_text(exc)
        if exc.code in (401, 403):
            raise StatusUsageError(f"{url} refused the command ({exc.code}): "
                                   f"{detail}", component="shutdown") from None
        raise StatusUnreachable(f"{url}/shutdown answered {exc.code}: {detail}",
                                component="shutdown") from None
    except (urllib.error.URLError, OSError) as exc:
        reason_text = getattr(exc, "reason", exc)
        raise StatusUnreachable(f"cannot reach the management API at {url} "
                                f"({reason_text}); is the appliance running with mgmt.listen "
                                "there? Point --mgmt at it", component="shutdown") from None
    except http.client.HTTPException as exc:
        raise StatusUnreachable(f"{url}/shutdown did not answer HTTP "
                                f"({type(exc).__name__}); is this a topicwire management "
                                "API?", component="shutdown") from None
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        doc = None
    if not isinstance(doc, dict) or not doc.get("ok"):
        raise StatusUnreachable(f"{url}/shutdown did not answer like a topicwire "
                                "management API", component="shutdown")
    return doc
