"""Broker-set and cluster names, and broker addresses, as the API takes them: one place for every route."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from electra.state.limits import ADDRESS_PATTERN, NAME_PATTERN

# Broker-set and cluster names: NAME_PATTERN (state/limits.py), shared with the ingest workers and the job.
Name = Annotated[str, Field(min_length=1, max_length=255, pattern=NAME_PATTERN)]
# A broker's address: no control characters (state/limits.py)
Address = Annotated[str, Field(min_length=1, max_length=255, pattern=ADDRESS_PATTERN)]
