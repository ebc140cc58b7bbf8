"""The files and directories a config names, and the TOML text itself, checked as strictly as
network input: every failure is a ``ConfigError`` naming the key, never another exception.

- A file is read at most ``limit`` bytes (a larger one is refused, not read) and must be UTF-8.
- A path is a non-empty string of at most ``MAX_PATH_CHARS`` characters without NUL, and
  leads nowhere under /proc or /sys (kernel interfaces: a read there may block or never end).
- A directory to write to (``telemetry.dir``) is one, or can be made: its nearest existing
  ancestor is a directory this process may write to.
- TOML text nests arrays and inline tables at most ``max_nesting`` deep (looked at before
  ``tomllib`` parses it, which recurses once per level); the refusal names the statement's key.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import tomllib
from pathlib import Path

from appliance.errors import ConfigError

MAX_PATH_CHARS = 4_096
"""PATH_MAX."""
REFUSED_DIRS = (Path("/proc"), Path("/sys"))
"""No path of a config may lead into these (kernel interfaces, not storage)."""


def _fail(key: str, what: str) -> ConfigError:
    return ConfigError(f"{key}: {what}")


def show(value: object) -> str:
    """A refused value, short: a string or scalar quoted (cut at 60 characters), an array or
    a table by its size."""
    if isinstance(value, dict):
        return f"a table of {len(value)} key{'' if len(value) == 1 else 's'}"
    if isinstance(value, list | tuple):
        return f"an array of {len(value)} value{'' if len(value) == 1 else 's'}"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, str) and len(value) > 60:
        return repr(value[:60]) + f"... ({len(value)} characters)"
    return repr(value)


def topic_patterns(value: object, key: str, most: int) -> tuple[str, ...]:
    """An array of at most ``most`` topic patterns, each one checked."""
    from datapath.topics.algebra import TopicError, split_pattern

    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise _fail(key, f"must be a list of topic patterns such as [\"prices/#\"], not "
                    f"{show(value)}")
    if len(value) > most:
        raise _fail(key, f"{len(value)} values; at most {most}")
    for pattern in value:
        try:
            split_pattern(pattern)
        except TopicError as exc:
            raise _fail(key, f"{show(pattern)}: {str(exc).removeprefix('topics: ')}") from None
    return tuple(value)


def path_of(value: object, key: str, base: Path, what: str = "a file path") -> Path:
    """The path a key gives (relative to ``base``, the config's directory)."""
    if not isinstance(value, str) or not value:
        raise _fail(key, f"must be {what} (a non-empty string)")
    if len(value) > MAX_PATH_CHARS or "\x00" in value:
        raise _fail(key, f"must be {what} of at most {MAX_PATH_CHARS} characters without NUL")
    path = Path(value)
    path = path if path.is_absolute() else base / path
    try:
        real = Path(os.path.realpath(path))
    except (OSError, ValueError) as exc:
        raise _fail(key, f"cannot resolve {path}: {exc}") from None
    for refused in REFUSED_DIRS:
        if real == refused or refused in real.parents:
            raise _fail(key, f"{path} is under {refused} (a kernel interface, not storage)")
    return path


def existing_file(value: object, key: str, base: Path) -> Path:
    """The path of a regular file that exists."""
    path = path_of(value, key, base)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise _fail(key, f"no such file: {path}") from None
        raise _fail(key, f"cannot look at {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise _fail(key, f"{path} is not a regular file")
    return path


def _where(path: Path, key: str | None) -> str:
    return str(path) if key is None else f"{key}: {path}"


def read_text(path: Path, key: str | None, limit: int) -> str:
    """A file's text: at most ``limit`` bytes of UTF-8. ``key`` is the config key naming the
    file (None: the config file itself)."""
    try:
        with open(path, "rb") as file:
            data = file.read(limit + 1)
    except FileNotFoundError:
        raise _fail(_where(path, key), "no such file") from None
    except OSError as exc:
        raise _fail(_where(path, key), f"cannot read it: {exc.strerror or exc}") from None
    return decode(data, path, limit, key)


def decode(data: bytes, path: Path, limit: int, key: str | None = None) -> str:
    """The text of a file's bytes: at most ``limit`` of them, UTF-8."""
    if len(data) > limit:
        raise _fail(_where(path, key), f"larger than {limit} bytes; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(_where(path, key), f"not UTF-8 text (byte {data[exc.start]:#04x} at offset "
                    f"{exc.start}); save it as UTF-8") from None


def writable_dir(value: object, key: str, base: Path) -> Path:
    """A directory to write to: one already, or one ``mkdir -p`` can make (nothing is made
    here)."""
    path = path_of(value, key, base, "a directory path")
    probe = path
    try:
        while True:
            try:
                mode = probe.stat().st_mode
                break
            except OSError as exc:  # missing, or under a file: look at the parent
                if exc.errno not in (errno.ENOENT, errno.ENOTDIR) or probe.parent == probe:
                    raise
                probe = probe.parent
    except OSError as exc:
        raise _fail(key, f"cannot look at {probe}: {exc.strerror}") from None
    if not stat.S_ISDIR(mode):
        where = "exists" if probe == path else f"is under the file {probe}"
        raise _fail(key, f"{path} {where} and is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "is not writable" if probe == path else f"cannot be made: {probe} is not writable"
        raise _fail(key, f"{path} {what} by this process")
    return path


_TOML_TOKEN_RE = re.compile(r"[\n#\"'=\[\]{}]")


def too_deep(text: str, max_nesting: int) -> str | None:
    """The key (``table.key``, as written) of the first TOML statement whose arrays or inline
    tables nest deeper than ``max_nesting``, or None. Only brackets outside strings and
    comments count; the text need not be valid TOML (the parser says what else is wrong)."""
    depth, table, key, start, in_value = 0, "", "", 0, False
    i, n = 0, len(text)
    while True:
        found = _TOML_TOKEN_RE.search(text, i)
        if found is None:
            return None
        i = found.start()
        c = text[i]
        if c == "\n":
            if depth == 0:
                in_value, start = False, i + 1
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "\"'":
            i = _string_end(text, i)
            continue
        elif c == "=" and depth == 0 and not in_value:
            key, in_value = text[start:i].strip(), True
        elif c == "[" and depth == 0 and not in_value:  # a [table] or [[table]] header
            end = text.find("\n", i)
            end = n if end < 0 else end
            table = text[i:end].partition("#")[0].strip().strip("[]").strip()
            i = end
            continue
        elif c in "[{":
            depth += 1
            if depth > max_nesting:
                return f"{table}.{key}" if table and key else table or key or "(top level)"
        elif c in "]}":
            depth = max(depth - 1, 0)
        i += 1


def _string_end(text: str, i: int) -> int:
    """The index after the TOML string starting at ``i`` (basic or literal, one line or
    multi-line); the end of the line or text for an unterminated one."""
    quote = text[i]
    n = len(text)
    if text.startswith(quote * 3, i):
        j = i + 3
        while j < n:
            if quote == '"' and text[j] == "\\":
                j += 2
            elif text.startswith(quote * 3, j):
                j += 3
                for _ in range(2):  # a closing delimiter may follow up to two quotes of content
                    if j < n and text[j] == quote:
                        j += 1
                return j
            else:
                j += 1
        return n
    j = i + 1
    while j < n and text[j] != "\n":
        if quote == '"' and text[j] == "\\":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    return j


def parse_toml(text: str, path: Path, max_nesting: int, key: str | None = None) -> dict:
    """The TOML document of ``path`` (the config itself, or the file config key ``key``
    names), its nesting bounded first."""
    deep = too_deep(text, max_nesting)
    if deep is not None:
        raise _fail(deep if key is None else f"{key}: {deep}", "arrays or inline tables "
                    f"nested deeper than {max_nesting} levels ({path})")
    where = _where(path, key)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _fail(where, f"not valid TOML: {exc}") from None
    except RecursionError:  # not below max_nesting; kept as the parser's own bound
        raise _fail(where, "nested too deeply to parse") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise _fail(where, f"not valid TOML: {exc}") from None
