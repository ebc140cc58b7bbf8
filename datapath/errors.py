"""The root of topicwire's error tree and the user/device split every package follows.

Every error a user can see names its component and says what to do, in the form
``"<component>: <what was refused>; <what to do>"`` (nats-server's style).
"""

from __future__ import annotations


class TopicwireError(Exception):
    """Base of every error topicwire raises on purpose."""

    component: str = "topicwire"

    def __init__(self, message: str, *, component: str | None = None) -> None:
        if component is not None:
            self.component = component
        super().__init__(f"{self.component}: {message}")


class UserError(TopicwireError):
    """Bad input from a user: arguments, config, topics, files. The CLI exits with code 2."""


class DeviceError(TopicwireError):
    """An OS or device resource failed; carries the errno where there is one."""

    def __init__(self, message: str, *, errno: int | None = None, component: str | None = None):
        self.errno = errno
        super().__init__(message, component=component)
