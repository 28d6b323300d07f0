"""The broker request interface (api/requests.py) and the controller service that implements it."""

from __future__ import annotations

import inspect

from electra.api.requests import BrokerRequests
from electra.api.service import ControllerService


def test_controller_service_has_every_request_method_with_the_same_signature() -> None:
    for name, proto in inspect.getmembers(BrokerRequests, inspect.isfunction):
        if name.startswith("_"):
            continue
        impl = getattr(ControllerService, name, None)
        assert impl is not None, f"ControllerService lacks {name}"
        assert inspect.signature(impl) == inspect.signature(proto), name
        assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(proto), name
