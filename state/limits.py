"""RocketMQ's Java integer types, as ranges every entry point enforces.

RocketMQ declares epochs and priorities `int` (int32) and offsets, broker ids and
timestamps `long` (int64) (see docs/rocketmq-differences.md). A number outside its
Java type can never come from a real broker, and once stored it would poison a
broker set: msgpack cannot encode integers of 2**64 and beyond, so every later
write of that set would fail. The HTTP models (api/app.py), the Kafka record rule
(streaming/records.py) and the state machine's command decoding (state/commands.py)
all check against these bounds; the last one is the backstop, through the field types below.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_BROKER_ID = 2**62  # below INT64_MAX so "next broker id" (max + 1) always stays a Java long

# Broker-set and cluster names: letters, digits and `_.:%-`, but not "." or "..", which are a URL's dot segments
# (clients, proxies and browsers resolve them away: such a set could be made and never named again). Written
# without look-arounds: pydantic's regex engine has none. The node's API (api/names.py) and the heartbeat rule of
# the ingest workers and the streaming job (streaming/records.py) both check it.
NAME_PATTERN = r"^(?:[A-Za-z0-9_.:%\-]*[A-Za-z0-9_:%\-][A-Za-z0-9_.:%\-]*|\.{3,})$"
_NAME = re.compile(NAME_PATTERN[:-1] + r"\Z")
# An integer as RocketMQ's string fields carry one: decimal text as Java's `Long.parseLong` reads it (no "1_0", no
# " 1", which Python's int() would take).
JAVA_LONG_TEXT = re.compile(r"[+-]?[0-9]+")
# A JSON number with a fraction or an exponent is read as a double: beyond 2**53 its integer part is no longer the
# one sent (9007199254740993.0 reads as ...992, 4611686018427387903.5 as 2**62), so such a float is no integer.
FLOAT_EXACT = 1 << 53

# Broker addresses (and the address in a registerCheckCode): any text but control characters (C0, DEL and C1:
# U+0000-U+001F, U+007F-U+009F). A broker's address is handed to every other broker as its master's
# (`masterAddress`), and RocketMQ's are HOST:PORT; a NUL or a newline in one is never an address, and once stored
# it would be served to the whole set. (pydantic's and Python's regex engines both read these patterns.)
ADDRESS_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_ADDRESS = 255
# RocketMQ's registerCheckCode is "address;timestamp", and ApplyBrokerId stores the part before the first ";" as
# the broker's address (state/machine.py): that part follows the address rule (1-255 characters), the rest only
# has no control character.
CHECK_CODE_PATTERN = rf"^[^\x00-\x1f\x7f-\x9f;]{{1,{MAX_ADDRESS}}}(?:;[^\x00-\x1f\x7f-\x9f]*)?$"


NAMES_SEEN_MAX = 32_768
_names_seen: set[str] = set()


def is_name(v: str) -> bool:
    """Whether `v` is a broker-set or cluster name (NAME_PATTERN; the length is checked apart).

    A name that matched is remembered (at most NAMES_SEEN_MAX, then all forgotten at once): the ingest workers
    and the job's reader check two names a heartbeat, a fleet's names repeat every second, and the regex costs
    about 1 µs a name where the set's lookup costs a twentieth of that."""
    if v in _names_seen:
        return True
    if _NAME.match(v) is None:
        return False
    if len(_names_seen) >= NAMES_SEEN_MAX:
        _names_seen.clear()
    _names_seen.add(v)
    return True


def as_java_integer(v: Any) -> Any:
    """`v` read as the node's API reads an integer field (api/app.py): decimal text and an integral float (within
    +-2**53, where a double holds the integer sent) become the number; anything else is returned unchanged, for
    `check_int` to accept or refuse (a bool stays a bool)."""
    if type(v) is str and JAVA_LONG_TEXT.fullmatch(v):
        try:
            return int(v)
        except ValueError:  # more digits than Python converts (4,300): beyond every Java type anyway
            return v
    if type(v) is float and v.is_integer() and -FLOAT_EXACT <= v <= FLOAT_EXACT:
        return int(v)
    return v


CONTENT_LENGTH_DIGITS = 19  # INT64_MAX has 19: a longer length (leading zeros aside) is over every body limit


def content_length(value: bytes) -> int | None:
    """A Content-Length header's value as the byte count it announces, or None if it is not ASCII decimal digits
    (each caller refuses that as before). Leading zeros are skipped, and more than CONTENT_LENGTH_DIGITS significant
    digits read as INT64_MAX + 1, over every limit (a 413): the HTTP parser takes any number of leading zeros, and
    `int()` of more than 4,300 digits raises ValueError (a 500 and a traceback, before any token check). The one
    reading of the header for the node's app, its lean path, the auth middleware, the dashboard login and the
    ingest server, so they answer alike."""
    if not value.isdigit():  # (bytes: ASCII digits only)
        return None
    digits = value.lstrip(b"0")
    if len(digits) > CONTENT_LENGTH_DIGITS:
        return INT64_MAX + 1
    return int(digits) if digits else 0


def printable(v: str) -> bool:
    """Whether `v` holds no control character (ADDRESS_PATTERN's rule, for hand-written checks)."""
    return _CONTROL.search(v) is None


# The same ranges as field types: msgspec checks them while it decodes a command or a record.
Int32Field = Annotated[int, msgspec.Meta(ge=INT32_MIN, le=INT32_MAX)]
Int64Field = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
BrokerIdField = Annotated[int, msgspec.Meta(ge=1, le=MAX_BROKER_ID)]


def check_int(name: str, v: Any, lo: int, hi: int) -> int:
    """`v` if it is an integer (not a bool) in [lo, hi], else ValueError naming the field, never the value."""
    if type(v) is not int or not lo <= v <= hi:
        raise ValueError(f"{name}: an integer between {lo} and {hi} is required")
    return v
