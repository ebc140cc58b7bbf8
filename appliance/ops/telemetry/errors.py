"""The telemetry package's errors: every one names the component and says what to do."""

from __future__ import annotations

from datapath.errors import TopicwireError, UserError

COMPONENT = "telemetry"


class TelemetryError(TopicwireError):
    """Base of every error the telemetry package raises."""

    component = COMPONENT


class TelemetryUserError(UserError, TelemetryError):
    """A bad argument: a directory that does not exist, a weight that does not parse."""

    component = COMPONENT


class RoutesError(TelemetryUserError):
    """The route job refused its input (no usable telemetry, bad options)."""

    component = "routes"
