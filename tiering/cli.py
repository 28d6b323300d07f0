"""`electra history`: controller state as of a past instant, and events between two instants, from the tier."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .options import parse_storage_options


def add_history_command(sub) -> None:
    h = sub.add_parser("history", help="state of every broker set as of a past instant, from the Delta tier",
                       description="Reads the tier's Delta tables directly (no controller needed). Times are "
                                   "ISO-8601 (UTC if no zone; 20261127 is a date), epoch milliseconds (13 digits; "
                                   "0 is the beginning) or `now`. "
                                   "A long event list comes in pages: --limit, then --after with the answer's "
                                   "events.next_after.")
    h.add_argument("--tier-uri", default=os.environ.get("ELECTRA_TIER_URI"), help="base URI of the tier tables")
    h.add_argument("--tier-options", type=parse_storage_options, default=None,
                   help="KEY=VALUE,... delta-rs storage options (object stores)")
    h.add_argument("--at", required=True, help="instant whose state to show")
    h.add_argument("--events-from", help="also list events from this instant ...")
    h.add_argument("--events-to", help="... to this one (inclusive)")
    h.add_argument("--limit", type=_event_limit, default=None,  # None: not given, so refused without a window
                   help="events at most (1-100000, default 100000; `truncated` says when more matched; "
                        "needs --events-from or --events-to)")
    h.add_argument("--after", type=_cursor, default=None,
                   help="events after this cursor only: a truncated answer's `next_after` (INDEX:SEQ), "
                        "or a Raft index")
    h.set_defaults(fn=cmd_history)


def _cursor(text: str) -> tuple[int, int]:
    from .reader import parse_cursor

    try:
        return parse_cursor(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _event_limit(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 100_000):
        raise argparse.ArgumentTypeError("expected a whole number of events from 1 to 100000")
    return int(text)


def cmd_history(args: argparse.Namespace) -> int:
    from .options import check_uri
    from .reader import MAX_EVENTS, TierReader, event_window, not_in_future, parse_time, tier_failure

    if not args.tier_uri:
        print("error: --tier-uri (or ELECTRA_TIER_URI) is required", file=sys.stderr)
        return 2
    try:
        check_uri(args.tier_uri)
    except ValueError as exc:
        print(f"error: --tier-uri: {exc}", file=sys.stderr)
        return 2
    times = {}
    for option, text in (("--at", args.at), ("--events-from", args.events_from), ("--events-to", args.events_to)):
        if text is not None:
            try:
                times[option] = parse_time(text)
                if option == "--at":
                    not_in_future(times[option])
            except ValueError as exc:
                print(f"error: {option}: {exc}", file=sys.stderr)
                return 2
    if args.events_from is None and args.events_to is None:
        for option, value, what in (("--after", args.after, "pages through"), ("--limit", args.limit, "caps the")):
            if value is not None:
                print(f"error: {option} {what} events: give --events-from or --events-to too", file=sys.stderr)
                return 2
    try:
        event_window(times.get("--events-from"), times.get("--events-to"))
    except ValueError:
        print("error: --events-from is after --events-to", file=sys.stderr)
        return 2
    reader = TierReader(args.tier_uri, args.tier_options)
    try:
        absence = reader.store.absence()
        if absence:
            print(f"error: {absence}", file=sys.stderr)
            return 1
        out = reader.history(times["--at"], times.get("--events-from"), times.get("--events-to"),
                             MAX_EVENTS if args.limit is None else args.limit, args.after)
    except Exception as exc:  # an object store that cannot be reached or read, a damaged table
        print(f"error: cannot read the tier at {args.tier_uri}: {tier_failure(exc)}", file=sys.stderr)
        return 1
    json.dump(out, sys.stdout, indent=2, sort_keys=True)
    print()
    return 0
