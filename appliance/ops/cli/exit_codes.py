"""One exit-code convention for every ``topicwire`` command (docs/appliance.md, "Exit codes").

    0    success; for predicates (``topic match``, ``warm --check``): true
    1    runtime failure: the command ran and the world said no (appliance not running or
         unreachable, connection lost for good, messages not acknowledged, a device error);
         for predicates: false
    2    usage or input error: bad arguments, config, input file, a refused request
         (entitlements, login); nothing was done, fix the input
    130  interrupted (Ctrl-C), as shells report SIGINT

Every failure prints one line on stderr, ``topicwire: <component>: <what>; <what to do>``,
never a traceback (``TOPICWIRE_TRACEBACK=1`` shows one for an unexpected error).
"""

from __future__ import annotations

from datapath.errors import UserError

OK = 0
FAILURE = 1
USAGE = 2
INTERRUPTED = 130


def runtime_errors() -> tuple[type[BaseException], ...]:
    """User-error subclasses that are runtime failures all the same (the appliance did not
    answer, the connection is gone): not the input's fault."""
    from appliance.client.errors import ConnectionLostError, NoAnswerError, UnacknowledgedError

    return (NoAnswerError, ConnectionLostError, UnacknowledgedError)


def exit_code(exc: BaseException) -> int:
    """The exit code of a command that raised ``exc``."""
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    if isinstance(exc, runtime_errors()):
        return FAILURE
    if isinstance(exc, UserError):
        return USAGE
    return FAILURE
