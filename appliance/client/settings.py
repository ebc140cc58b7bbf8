"""The client library's own tunables: liveness, reconnection, acknowledgement waits (units in
the names). ``connect(...)`` takes the per-client ones as arguments (named below); the
appliance-wide client settings (heartbeat interval, request timeouts, batching budget) are
in appliance/config.py."""

from __future__ import annotations

SESSION_TIMEOUT_S = 10.0
"""A client that hears nothing from its appliance for this long declares the connection
lost (``connect(..., session_timeout_s=)``). Longer than the appliance's
``clients.session_dead_ms`` (5 s): an appliance whose data path compiles its kernels on a
cold cache (no ``topicwire warm``) answers nothing for seconds, and is not lost."""
SESSION_TIMEOUT_MIN_S = 0.2
SESSION_TIMEOUT_MAX_S = 3_600.0
"""Bounds of ``session_timeout_s``."""
LIVENESS_PROBES_PER_TIMEOUT = 4
"""While the appliance is silent, the client asks it whether its session is still there
(a repeat of its login, which the appliance answers with the session it made) this many
times per session timeout..."""
LIVENESS_PROBE_MAX_INTERVAL_NS = 1_000_000_000
"""...but at least this often."""
RECONNECT_S = 60.0
"""After a lost connection the client tries to connect again for this long before it gives
up and closes (``connect(..., reconnect_s=)``; 0: never reconnect)."""
RECONNECT_MAX_S = 86_400.0
"""Bound of ``reconnect_s``."""
RECONNECT_BACKOFF_FIRST_S = 0.1
"""Wait before the second attempt; it doubles after each failed attempt..."""
RECONNECT_BACKOFF_MAX_S = 5.0
"""...up to this long."""
RECONNECT_JITTER_FRACTION = 0.5
"""Each wait is drawn uniformly from [(1 - this) x backoff, backoff], so clients that lost
the same appliance do not all come back in the same instant."""
RECONNECT_LOGIN_TIMEOUT_S = 2.0
"""How long one reconnection attempt waits for each answer (login, registrations,
subscriptions) before it counts as failed."""
CLOSE_ACK_TIMEOUT_S = 2.0
"""How long ``close`` waits for the appliance to acknowledge the guaranteed messages sent;
what is still unacknowledged then fails (reason ``session closed``)."""
LOGIN_ROUNDS = 3
"""Challenges a login answers at most (one is the rule; a repeated LOGIN crossing the proof
may bring another) before it gives up."""
SHM_RX_RING_BYTES = 4 * 1024 * 1024
"""The receive ring a shared-memory client makes (the appliance writes into it): room for a
1 MiB best-effort message's segments and more while the client thread drains it (the
channel's default, 1 MiB, dropped some of them under load)."""
SEND_WAIT_S = 1.0
"""How long a publish frame waits for a channel that pushes back (a full shared-memory ring,
a full socket buffer, an RDMA peer out of receive credits) to take it before the frame is
dropped and counted (``send_drops``, ``messages_dropped_at_send``): a publisher faster than
its path is slowed down, not silently thinned out."""
POLL_LIMIT = 4_096
"""Messages one ``Client.poll`` call hands over at most by default (``limit=``)."""
POLL_LIMIT_MAX = 1 << 30
"""Bound of ``limit``."""
POLL_QUEUE_BYTES = 64 * 1024 * 1024
"""Received frames a client holds for ``poll`` before it drops further ones (counted in
``poll_counters()``: ``dropped_frames``, ``dropped_messages``)."""
POLL_CHUNK_FRAMES = 64
"""Frames one decode of ``poll`` takes from the queue at most..."""
POLL_STAGING_BYTES = 4 * 1024 * 1024
"""...and bytes (the staging buffer the payload memoryviews point into)."""
POLL_UNRESOLVED_GIVE_UP_NS = 5_000_000_000
"""A message whose topic key the appliance has not resolved for this long is dropped by
``poll`` and counted (``unresolved``); until then ``poll`` stops at it (order is kept)."""
PUBLISH_BATCH_MESSAGES = 65_536
"""Messages ``publish_batch`` packs per kernel call (a longer batch takes several)."""
