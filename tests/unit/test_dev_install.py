"""Every tool sees each source file under its installed name, from inside the repository or not.

Two things make that so (docs/development.md): `electra/` links its sub-packages
(electra/consensus -> ../consensus), so the repository root is a complete source root for
anything started there (`python -m pytest`, mypy, an IDE); and `make setup` installs electra
as a strict editable install, a tree of links named as installed that processes started
elsewhere (the test clusters' nodes) and mypy find through the venv. That tree links the files
present at install time: a module added since needs `make setup` again (the Makefile's stamp
covers the file list), which the second test says when a venv was set up by hand.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_ORIGINS = """
import importlib.util, json, sys
print(json.dumps({n: (s.origin if (s := importlib.util.find_spec(n)) else None) for n in sys.argv[1:]}))
"""


def _source_modules() -> dict[str, Path]:
    """Installed module name -> source file, for every .py file of every package folder."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for package, folder in dirs.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path.resolve()
    return found


def _wrong(origins: dict[str, str | None]) -> list[str]:
    sources = _source_modules()
    return [f"{name}: {origin}" for name, origin in origins.items()
            if origin is None or Path(origin).resolve() != sources[name]]


def test_this_process_imports_every_module_from_this_tree():
    origins = {name: (s.origin if (s := importlib.util.find_spec(name)) else None) for name in _source_modules()}
    assert not _wrong(origins), f"not found, or found outside {ROOT}: {_wrong(origins)}"


def test_a_process_started_outside_the_repository_sees_the_same_modules():
    out = subprocess.run([sys.executable, "-c", _ORIGINS, *_source_modules()], cwd="/", capture_output=True,
                         text=True, timeout=120, check=True).stdout
    wrong = _wrong(json.loads(out))
    assert not wrong, f"run `make setup` (the install links the files present when it ran): {wrong}"
