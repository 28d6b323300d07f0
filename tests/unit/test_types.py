"""Static types: mypy in strict mode over state/ (configured in pyproject.toml, [tool.mypy]).

state/ is checked as the package `state` from the repository root: the installed name
`electra.state` comes from setuptools' editable import hook, which mypy cannot follow,
and state/ imports nothing else of Electra. Run by hand: `.venv/bin/python -m mypy state/`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_state_is_clean_under_mypy_strict():
    proc = subprocess.run([sys.executable, "-m", "mypy", "state/"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
