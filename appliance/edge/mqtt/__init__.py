"""The MQTT 3.1.1/5.0 server of an edge appliance (docs/mqtt.md).

``codec.py`` the packets; ``topics.py`` MQTT's topic rules; ``server.py`` the listeners and
event loop; ``transports.py`` TLS and WebSocket; ``connection.py`` one connection;
``sessions.py`` a session apart from its connection (persistent sessions, deliveries);
``handle_connect.py``, ``handle_publish.py``, ``handle_subscribe.py`` the packet families;
``shared.py`` shared subscriptions; ``successor.py`` successor delivery (seed 004);
``meta.py`` MQTT metadata to and from native headers (``mqtt.``);
``retain.py`` the retained store; ``store.py`` the state on disk (``mqtt.state_dir``) and
``journal.py`` its journal (also the bridges' backlog's, ``bridge_backlog.py``).
"""
