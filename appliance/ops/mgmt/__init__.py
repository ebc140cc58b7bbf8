"""Management and observability of an appliance: the HTTP API, Prometheus metrics, JSON logs.

``serve(appliance, config)`` is the management hook ``Appliance.start`` calls when
``mgmt.listen`` is set (docs/appliance.md, "Management API"); it returns the running
server, which ``Appliance.stop`` closes: a ``ProcessServer`` (``process``: the API runs in a
process of its own, ``child``, fed snapshots by the appliance) unless ``mgmt.process = false``,
then a ``MgmtServer`` on a thread of the appliance. ``server`` has the endpoints, ``metrics`` the
Prometheus collector over the status snapshot, ``logs`` the structured (JSON lines) logging
of ``[log]``. ``topicwire status`` (appliance/ops/cli/status_cmd.py) is the API's client.
"""

from appliance.ops.mgmt.server import MgmtServer, launch, serve

__all__ = ["MgmtServer", "launch", "serve"]
