"""The MQTT 3.1.1/5.0 server of an edge appliance (docs/edge.md).

``codec.py`` the packets; ``topics.py`` MQTT's topic rules; ``server.py`` the listener and
event loop; ``session.py`` one connection; ``handle_connect.py``, ``handle_publish.py``,
``handle_subscribe.py`` the packet families; ``retain.py`` the retained store.
"""
