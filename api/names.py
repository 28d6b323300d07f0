"""Broker-set and cluster names, and broker addresses, as the API takes them: one place for every route."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from electra.state.limits import ADDRESS_PATTERN

# Broker-set and cluster names: letters, digits and `_.:%-`, but not "." or "..", which are a URL's dot segments
# (clients, proxies and browsers resolve them away: such a set could be made and never named again). Written
# without look-arounds: pydantic's regex engine has none.
NAME_PATTERN = r"^(?:[A-Za-z0-9_.:%\-]*[A-Za-z0-9_:%\-][A-Za-z0-9_.:%\-]*|\.{3,})$"
Name = Annotated[str, Field(min_length=1, max_length=255, pattern=NAME_PATTERN)]
# A broker's address: no control characters (state/limits.py)
Address = Annotated[str, Field(min_length=1, max_length=255, pattern=ADDRESS_PATTERN)]
