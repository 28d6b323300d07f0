"""The operator notebooks' parameters: a Databricks widget there, `ELECTRA_<NAME>` elsewhere, checked once.

Every notebook in notebooks/ reads its parameters through these functions, so a bad value (a negative
window, `ELECTRA_ENDPOINTS=,`, a word where a number belongs) stops the first cell with one line that
names the parameter, its environment variable and what it accepts, instead of a traceback from deep
in pandas or an empty answer computed from nonsense.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any


class ParameterError(ValueError):
    """A notebook parameter that cannot be used; the message says which and what it takes."""


def _widgets() -> Any:
    """Databricks' `dbutils.widgets`, or None outside Databricks.

    `dbutils` lives in the notebook's namespace: the calling cell's globals (found by walking up the
    stack), which IPython also makes `__main__`."""
    import __main__

    namespaces = [vars(__main__)]
    frame = sys._getframe(1)
    while frame is not None:
        namespaces.append(frame.f_globals)
        frame = frame.f_back
    for ns in namespaces:
        dbutils = ns.get("dbutils")
        if dbutils is not None:
            return getattr(dbutils, "widgets", None)
    return None


def text(name: str, default: str) -> str:
    """The parameter as given (a widget's value, else ELECTRA_<NAME>), or `default` when empty or unset."""
    widgets = _widgets()
    if widgets is not None:
        widgets.text(name, default)
        return widgets.get(name) or default
    return os.environ.get(env_name(name), default).strip() or default


def env_name(name: str) -> str:
    return f"ELECTRA_{name.upper()}"


def _refuse(name: str, what: str, value: str) -> ParameterError:
    shown = value if len(value) <= 80 else value[:80] + "..."
    return ParameterError(f"parameter {name} ({env_name(name)}): expected {what}, got {shown!r}")


def number(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite number within [minimum, maximum]."""
    raw = text(name, str(default))
    bounds = " ".join(filter(None, (f">= {minimum:g}" if minimum is not None else "",
                                    f"<= {maximum:g}" if maximum is not None else "")))
    what = f"a number {bounds}".strip()
    try:
        value = float(raw)
    except ValueError:
        raise _refuse(name, what, raw) from None
    if not math.isfinite(value) or (minimum is not None and value < minimum) \
            or (maximum is not None and value > maximum):
        raise _refuse(name, what, raw)
    return value


def whole(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    """A whole number within [minimum, maximum]."""
    raw = text(name, str(default))
    what = f"a whole number >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
    digits = raw.lstrip("+-")
    if not (digits.isascii() and digits.isdecimal() and len(digits) <= 18):
        raise _refuse(name, what, raw)
    value = int(raw)
    if value < minimum or (maximum is not None and value > maximum):
        raise _refuse(name, what, raw)
    return value


def endpoints(name: str, default: str) -> list[str]:
    """Comma-separated HOST:PORT controller addresses; at least one."""
    raw = text(name, default)
    out = [e.strip() for e in raw.split(",") if e.strip()]
    what = "comma-separated HOST:PORT addresses (e.g. 127.0.0.1:7301,127.0.0.1:7302)"
    if not out:
        raise _refuse(name, what, raw)
    for ep in out:
        host, _, port = ep.rpartition(":")
        if "://" in ep or not host or not (port.isascii() and port.isdecimal() and 0 < int(port) < 65536):
            raise _refuse(name, what, raw)
    return out


def instant(name: str, default: str = "") -> int | None:
    """An instant (ISO-8601, epoch ms, `now`; `electra history`'s rules) as epoch ms; None when empty."""
    from electra.tiering.reader import parse_time

    raw = text(name, default)
    if not raw:
        return None
    try:
        return parse_time(raw)
    except ValueError as exc:
        raise _refuse(name, f"an instant: {exc}", raw) from None


def choice(name: str, default: str, options: tuple[str, ...]) -> str:
    raw = text(name, default)
    if raw not in options:
        raise _refuse(name, "one of " + ", ".join(options), raw)
    return raw
