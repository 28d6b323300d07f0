"""SIGTERM and SIGHUP unwind a command like Ctrl-C (electra/interrupts.py); the real-process check is
tests/integration/test_bench_stops_what_it_started.py."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from electra.interrupts import terminate_as_interrupt


def test_sigterm_and_sighup_unwind_like_ctrl_c_once_then_the_old_handlers_are_back():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    cleaned = False
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
            raise AssertionError("SIGTERM did not interrupt")
        finally:
            os.kill(os.getpid(), signal.SIGHUP)  # a second signal during the cleanup is ignored
            cleaned = True
    assert cleaned
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_an_ignored_signal_stays_ignored_and_off_the_main_thread_nothing_is_installed():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
        errors = []

        def elsewhere() -> None:
            try:
                with terminate_as_interrupt():
                    pass
            except Exception as exc:  # signal.signal off the main thread raises ValueError
                errors.append(exc)

        t = threading.Thread(target=elsewhere)
        t.start()
        t.join(10)
        assert errors == []
    finally:
        signal.signal(signal.SIGHUP, before)
