"""Broker-set and cluster names as the API takes them, in one place for every route that names one."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# Broker-set and cluster names: letters, digits and `_.:%-`, but not "." or "..", which are a URL's dot segments
# (clients, proxies and browsers resolve them away: such a set could be made and never named again). Written
# without look-arounds: pydantic's regex engine has none.
NAME_PATTERN = r"^(?:[A-Za-z0-9_.:%\-]*[A-Za-z0-9_:%\-][A-Za-z0-9_.:%\-]*|\.{3,})$"
Name = Annotated[str, Field(min_length=1, max_length=255, pattern=NAME_PATTERN)]
