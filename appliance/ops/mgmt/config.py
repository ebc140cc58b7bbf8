"""Tunables of the management API, ``topicwire status`` and the structured logs (units in names).

The ``MGMT_MAX_*`` and timeout values bound what one client can make the API hold: a request
past a bound is refused with a JSON error (docs/appliance.md, "Management API": the status
each bound answers with), never read to its end.
"""

from __future__ import annotations

import struct

MGMT_DEFAULT_HOST = "127.0.0.1"
"""Where the management API listens unless ``mgmt.listen`` names another address."""
MGMT_DEFAULT_PORT = 8470
"""The management API's port in the documented config and ``topicwire status``'s default URL."""
MGMT_MAX_REQUEST_LINE_BYTES = 8_192
"""The request line (method, path with its query, version, CRLF) is at most this long (414)."""
MGMT_MAX_HEADER_LINE_BYTES = 8_192
"""One header line (name, value, CRLF) is at most this long (431)."""
MGMT_MAX_HEADERS = 64
"""A request carries at most this many header lines (431)."""
MGMT_MAX_HEADER_BYTES = 32_768
"""All header lines of a request together are at most this long (431)."""
MGMT_MAX_BODY_BYTES = 65_536
"""A request body larger than this is refused (413) without being read."""
MGMT_MAX_QUERY_FIELDS = 16
"""A command's query string holds at most this many ``name=value`` fields (400)."""
MGMT_REQUEST_TIMEOUT_S = 10.0
"""Each request (request line, headers and body) must have arrived within this long of the
connection being ready for it: a connection that sends nothing for this long is closed, one
that is partway through a request is answered 408 and closed (slow or stuck clients). Writing
an answer to a client that does not read it gives up after this long too."""
MGMT_MAX_CONNECTIONS = 32
"""Connections served at once (one thread each); one more is answered 503 and closed."""
MGMT_RETRY_AFTER_S = 1
"""The ``Retry-After`` of a 503 for too many connections (whole seconds)."""
MGMT_LISTEN_BACKLOG = 64
"""Connections the kernel queues before the API accepts them."""
MGMT_LINGER_S = 1.0
"""After refusing a request it did not read to its end, the API reads (and drops) what the
client still sends for at most this long before closing, so that the client sees the answer
rather than a reset."""
MGMT_LINGER_BYTES = 1_048_576
"""... and at most this many bytes of it."""
MGMT_LOGGED_TEXT_CHARS = 200
"""A client's request line or path is cut to this many characters in the log and in errors."""
MGMT_OVERLOAD_LOG_INTERVAL_S = 60.0
"""Connections turned away for ``MGMT_MAX_CONNECTIONS`` are logged as a warning at most once
per this long (with how many since the last warning)."""
MGMT_SHUTDOWN_POLL_S = 0.2
"""How often the server thread checks for ``close()`` (the longest ``close()`` waits for it)."""
STATUS_HTTP_TIMEOUT_S = 5.0
"""How long ``topicwire status`` waits for the appliance's answer."""
STATUS_MAX_TIMEOUT_S = 3600.0
"""Longest ``topicwire status --timeout`` (an hour: past it, no answer is coming)."""
METRICS_LATENCY_BUCKETS_S = (0.000_001, 0.000_002_5, 0.000_005, 0.000_01, 0.000_025, 0.000_05,
                             0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
                             0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (``le``, seconds) of ``topicwire_channel_latency_seconds``'s buckets (and
``+Inf``): the same on every appliance, so that histograms add up across a fabric."""
METRICS_FRAME_SIZE_BUCKETS_BYTES = tuple(1 << k for k in range(6, 17))
"""Upper bounds (``le``, bytes: 64 B to 64 KiB, powers of two, and ``+Inf``) of
``topicwire_channel_received_frame_size_bytes``'s buckets; each is a slot edge of the
channel's own size histogram (channels/stats.py, ``SIZE_BUCKETS``), so the counts are exact."""
FEED_HEADER = struct.Struct(">I")
"""Each frame of the appliance's feed to the API's own process: this length prefix, then the
pickled snapshot (appliance/ops/mgmt/process.py writes it, child.py reads it)."""
MGMT_FEED_PERIOD_S = 0.25
"""With ``mgmt.process`` (the default), the appliance sends the API's process a snapshot (status
document, channel figures, garbage-collector counts, health) this often, and at once when the
control agent publishes a new status (every 250 ms, ``STATUS_REFRESH_NS``): the API answers
reads from the latest one, at most this long (plus the status's own age) old."""
MGMT_FEED_CHECK_S = 0.05
"""How often the appliance's feeding thread looks for a newly published status."""
MGMT_PROCESS_NICE = 10
"""The API's process runs this much nicer than its appliance: on a host with fewer cores than
busy threads (the appliance's data path, its clients, scrapers), the scheduler gives the data
path the CPU first (`topicwire bench fabric --scrape-hz`)."""
MGMT_MAX_FORWARDED = 4
"""Commands (POST, DELETE) the API's process has waiting on the appliance at once; one more is
answered 503 with ``Retry-After`` (the appliance applies them one at a time)."""
MGMT_START_TIMEOUT_S = 30.0
"""The API's process must be serving within this long of being started (a loaded host may take
seconds to import it), else the appliance reports it and does not start."""
MGMT_RESTART_BACKOFF_S = 1.0
"""An API process that ended on its own is started again, at most once per this long (each end
is logged as an error)."""
MGMT_STOP_TIMEOUT_S = 3.0
"""``close()`` waits this long for the API's process to end after its feed is closed, then kills
it."""
MGMT_LINK_MAX_LINE_BYTES = 2 * 65_536 + 4_096
"""Longest line (one JSON command or answer) on the socket between the API's process and the
appliance."""
