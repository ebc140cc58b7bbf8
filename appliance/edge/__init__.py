"""The edge appliance: a core that also terminates external protocols (docs/mqtt.md).

One module per protocol edge (``mqtt/``: the MQTT 3.1.1/5.0 server), one handler module per
packet family inside it. ``EdgeAppliance`` (``node.py``) runs them beside the appliance.
"""
