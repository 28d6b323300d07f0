"""Argument parsing for every `electra` command and benchmark: numbers are checked where they are parsed.

A negative count, duration or size is never meaningful to Electra's commands, and left unchecked it
reached the code as a zero-episode run with a RESULT line, or a benchmark with a negative duration.
`Parser` refuses such values with argparse's usual message (exit 2) before anything starts.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn


def refuse(message: str) -> NoReturn:
    """A bad setting found after argparse (environment, TOML, a combination of options): `error: ...`, exit 2,
    as argparse ends on a bad argument."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_addr(text: str, min_port: int = 0) -> tuple[str, int]:
    """`HOST:PORT` (port 0: any free port, unless `min_port` is 1: an address to dial), IPv6 as `[::1]:PORT`."""
    try:
        host, port = text.rsplit(":", 1)
        port_no = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad address {text!r}: expected HOST:PORT") from None
    if "://" in text:
        raise argparse.ArgumentTypeError(f"bad address {text!r}: write HOST:PORT, without a scheme")
    if not host or not min_port <= port_no < 65536:
        raise argparse.ArgumentTypeError(f"bad address {text!r}: expected HOST:PORT, port {min_port}-65535")
    if host != host.strip() or any(c.isspace() for c in host):
        raise argparse.ArgumentTypeError(f"bad address {text!r}: a host has no blanks")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise argparse.ArgumentTypeError(f"bad address {text!r}: write an IPv6 host in brackets, [::1]:PORT")
    return host, port_no


def server_list(text: str) -> str:
    """An argparse `type` for `HOST[:PORT][,HOST[:PORT]...]`: Kafka bootstrap servers, controller or ingest
    endpoints. Each entry may carry a `SCHEME://` prefix and leave out its port, as Kafka clients (which strip
    `PLAINTEXT://` or `SASL_SSL://` and default to 9092) and the job's controller client (`https://`) take them;
    what is checked is what no client can use: an empty entry or host, a blank inside one, a port that is not
    1-65535. Returned with blanks around the commas dropped: a typo is refused here, not logged as "unreachable"
    every few seconds."""
    parts = [t.strip() for t in text.split(",") if t.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected HOST:PORT[,HOST:PORT...], got nothing")
    for part in parts:
        addr = part.split("://", 1)[-1]
        if _ipv6(addr) or (addr[:1] == "[" and addr[-1:] == "]" and _ipv6(addr[1:-1])):
            continue  # an IPv6 literal without a port
        host, sep, port = addr.rpartition(":")
        if not sep:
            host, port = addr, "9092"  # no port: the client's default
        if (not host or any(c.isspace() for c in part) or (":" in host and not (host[0] == "[" and host[-1] == "]"))
                or not (port.isdigit() and 0 < int(port) < 65536)):
            raise argparse.ArgumentTypeError(f"bad address {part!r}: expected HOST:PORT, port 1-65535 (an IPv6 "
                                             "host in brackets: [::1]:PORT)")
    return ",".join(parts)


def _ipv6(text: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def optional_server_list(text: str) -> str:
    """`server_list`, where an empty value means none (an unset variable in a unit file or a ConfigMap)."""
    return server_list(text) if text.strip() else ""


def topic_prefix(text: str) -> str:
    """An argparse `type` for a Kafka topic prefix: every topic it makes (`records.Topics.prefixed`) must be a Kafka
    topic name (`records.is_topic_name`), else the stack started and failed at its first topic."""
    from electra.streaming.records import Topics, is_topic_name

    bad = [t for t in vars(Topics.prefixed(text)).values() if not is_topic_name(t)]
    if bad:
        raise argparse.ArgumentTypeError(f"{text!r} does not make Kafka topic names ({bad[0]!r}: 1-249 of "
                                         "A-Z a-z 0-9 . _ -)")
    return text


def make_dir(path: str | Path, option: str) -> Path:
    """Create the directory an option names (parents too) before anything starts, or refuse with the reason
    (a file in the way, no permission) instead of a traceback after the work began."""
    if Path(path).exists() and not Path(path).is_dir():  # mkdir would say only "File exists"
        refuse(f"{option} {path} is a file, not a directory")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        refuse(f"{option} {path}: cannot create the directory ({exc.strerror or exc})")
    return Path(path)


def _bound(value: float) -> str:
    """A bound as a person writes it: 100000000, not 1e+08; 0.5 stays 0.5."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def at_least(kind: type, minimum: float, maximum: float | None = None) -> Callable[[str], Any]:
    """An argparse `type` converting with `kind` (int or float) and refusing values outside [minimum, maximum]."""

    def convert(text: str) -> Any:
        value = kind(text)  # ValueError here: argparse says "invalid int value"
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {_bound(minimum)}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {_bound(maximum)}, got {text}")
        return value

    convert.__name__ = kind.__name__
    return convert


def count_list(minimum: int, maximum: int | None = None, *, sort: bool = True) -> Callable[[str], list[int]]:
    """An argparse `type` for a comma list of counts (`10,100,1000`): each in [minimum, maximum], without
    repeats; sorted (sweeps run their sizes smallest first), or with `sort=False` in the order given
    (where the first one means something)."""

    def convert(text: str) -> list[int]:
        items = text.split(",")
        if any(x.strip() for x in items) and not all(x.strip() for x in items):
            raise argparse.ArgumentTypeError(f"expected counts like 10,100,1000 (no empty item), got {text!r}")
        try:
            counts = list(dict.fromkeys(int(x) for x in items if x.strip()))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected counts like 10,100,1000, got {text!r}") from None
        if not counts:
            raise argparse.ArgumentTypeError(f"expected at least one count, got {text!r}")
        if sort:
            counts.sort()
        if min(counts) < minimum or (maximum is not None and max(counts) > maximum):
            bounds = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"every count must be {bounds}, got {text}")
        return counts

    convert.__name__ = "count list"
    return convert


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose int and float options are at least `minimum` (default 0).

    `add_argument(..., minimum=1)` for counts that must be positive, `maximum=` for a bounded one (a
    port, a fraction); `minimum=None` for a number that may be negative. Sub-commands made with
    `add_subparsers()` are `Parser`s too.
    """

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Parse as argparse does, and note in `command_parser` the innermost parser that ran.

        A sub-command's parser runs inside its parent's and returns first, so the innermost one
        names itself; an unknown argument is then refused by the parser whose usage fits it.
        """
        parsed, extra = super().parse_known_args(args, namespace)
        if getattr(parsed, "command_parser", None) is None:
            parsed.command_parser = self
        return parsed, extra

    def add_argument(self, *args: Any, minimum: float | None = 0, maximum: float | None = None,
                     **kwargs: Any) -> argparse.Action:
        kind = kwargs.get("type")
        if kind in (int, float) and minimum is not None:
            kwargs["type"] = at_least(kind, minimum, maximum)
        return super().add_argument(*args, **kwargs)
