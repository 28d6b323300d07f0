"""Broker-set and cluster names as the API takes them, in one place for every route that names one."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

NAME_PATTERN = r"^[A-Za-z0-9_.:%\-]+$"  # broker-set and cluster names
Name = Annotated[str, Field(min_length=1, max_length=255, pattern=NAME_PATTERN)]
