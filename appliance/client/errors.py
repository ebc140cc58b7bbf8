"""The client API's errors: one family under ``ClientError`` (component ``client``)."""

from __future__ import annotations

from datapath.errors import UserError


class ClientError(UserError):
    """A refused client operation (component ``client``)."""

    component = "client"


class LoginError(ClientError):
    """The appliance refused the login (unknown identity, no P&M yet, shutting down)."""


class EntitlementError(ClientError):
    """P&M's entitlements refused a subscription or a publish."""


class SelectorRefusedError(ClientError):
    """The appliance refused a subscription's selector: it does not parse, or names a field
    the appliance cannot evaluate, or the session holds too many selectors (the reason says
    which; docs/selectors.md, "In the fabric")."""


class NoAnswerError(ClientError):
    """The appliance did not answer a request in time, or its channel is gone: it is not
    running, not reachable, or overloaded (a runtime failure, not a refusal)."""


class BusyError(ClientError):
    """The appliance could not take a (un)subscribe now: its session had
    ``clients.max_pending_requests`` requests waiting for their answer (those of an earlier
    request it did not answer in time, for one). Not a refusal: ask again later."""


class ConnectionLostError(ClientError):
    """The connection to the appliance was lost: raised by the next call after the loss
    (once, even when the client has reconnected meanwhile) and by every call while it is
    not connected again. ``state`` is the connection state when raised."""

    def __init__(self, message: str, *, state: str = "lost") -> None:
        super().__init__(message)
        self.state = state


class UnacknowledgedError(ClientError):
    """Guaranteed messages the appliance did not acknowledge: ``failed`` (their outcomes
    failed since the last report: appliance lost, session closed, refused), ``pending``
    (still unacknowledged when the wait ended); ``reasons`` counts the failed by reason."""

    def __init__(self, message: str, *, failed: int, pending: int,
                 reasons: dict[str, int]) -> None:
        super().__init__(message)
        self.failed = failed
        self.pending = pending
        self.reasons = dict(reasons)

    @property
    def count(self) -> int:
        """Messages not acknowledged: failed plus still pending."""
        return self.failed + self.pending


class PublishFailedError(ClientError):
    """One guaranteed message's outcome: it will not be acknowledged (``reason``)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class BackPressureError(ClientError):
    """A publish waited ``Client.flow_wait_s`` while the appliance held the publisher off
    (a throttling subscriber's queue is full: docs/flow-control.md); nothing was sent.
    Publish it again later."""
