"""The operator notebooks' parameters (electra/notebook_params.py): environment values checked with clear errors."""

from __future__ import annotations

import pytest

from electra import notebook_params as p


def test_values_from_the_environment_and_defaults(monkeypatch):
    monkeypatch.setenv("ELECTRA_ENDPOINTS", " 127.0.0.1:7301 , [::1]:7302,")
    monkeypatch.setenv("ELECTRA_WINDOW_MIN", "2.5")
    monkeypatch.setenv("ELECTRA_TOP_SETS", "12")
    monkeypatch.setenv("ELECTRA_AT", "2026-11-27T16:00:00Z")
    monkeypatch.setenv("ELECTRA_TIER_URI", "  ")
    assert p.endpoints("endpoints", "x:1") == ["127.0.0.1:7301", "[::1]:7302"]
    assert p.number("window_min", 60, minimum=0) == 2.5
    assert p.whole("top_sets", 8, minimum=1) == 12
    assert p.instant("at") == 1_795_795_200_000
    assert p.text("tier_uri", "dflt") == "dflt"  # blank means the default
    assert p.instant("since") is None and p.number("timeout_s", 2) == 2 and p.choice("use_spark", "auto",
                                                                                       ("auto", "1")) == "auto"


@pytest.mark.parametrize(("call", "value", "expect"), [
    (lambda: p.endpoints("endpoints", "x:1"), ",", "comma-separated HOST:PORT"),
    (lambda: p.endpoints("endpoints", "x:1"), "http://a:1", "comma-separated HOST:PORT"),
    (lambda: p.endpoints("endpoints", "x:1"), "a:0", "comma-separated HOST:PORT"),
    (lambda: p.number("endpoints", 60, minimum=0), "-5", "a number >= 0, got '-5'"),
    (lambda: p.number("endpoints", 60, minimum=0), "nan", "a number >= 0"),
    (lambda: p.number("endpoints", 2, minimum=0.1, maximum=600), "1e9", "a number >= 0.1 <= 600"),
    (lambda: p.whole("endpoints", 8, minimum=1), "0", "a whole number >= 1"),
    (lambda: p.whole("endpoints", 8, minimum=1), "1.5", "a whole number >= 1"),
    (lambda: p.instant("endpoints"), "yesterday", "an instant: expected an ISO-8601 time"),
    (lambda: p.choice("endpoints", "auto", ("auto", "1", "0")), "yes", "one of auto, 1, 0"),
])
def test_bad_values_are_refused_naming_the_parameter(monkeypatch, call, value, expect):
    monkeypatch.setenv("ELECTRA_ENDPOINTS", value)
    with pytest.raises(p.ParameterError, match="parameter endpoints \\(ELECTRA_ENDPOINTS\\): expected") as err:
        call()
    assert expect in str(err.value)


def test_databricks_widgets_are_used_when_present(monkeypatch):
    import __main__

    class Widgets:
        def __init__(self):
            self.values = {"brokers": "300"}

        def text(self, name, default):
            self.values.setdefault(name, "")

        def get(self, name):
            return self.values[name]

    monkeypatch.setattr(__main__, "dbutils", type("D", (), {"widgets": Widgets()})(), raising=False)
    monkeypatch.setenv("ELECTRA_BROKERS", "5")
    assert p.whole("brokers", 30000) == 300 and p.text("tier_uri", "d") == "d"


def test_databricks_widgets_are_found_in_the_calling_cells_namespace(monkeypatch):
    """On Databricks `dbutils` is a name in the notebook's globals; the lookup must not depend on `__main__`."""
    class Widgets:
        def text(self, name, default):
            pass

        def get(self, name):
            return "7"

    cell_globals = {"dbutils": type("D", (), {"widgets": Widgets()})(), "p": p}
    monkeypatch.setenv("ELECTRA_TOP_SETS", "5")
    assert eval("p.whole('top_sets', 8)", cell_globals) == 7
