"""An earlier commit's ``gateway`` and ``state``, importable beside today's (for the fixture
writers in this folder, as bench/engine_ab.py does): exported from git into ``root`` and
renamed ``<prefix>_gateway`` / ``<prefix>_state``, their imports rewritten to match."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def export_base(base: str, root: Path, prefix: str) -> Callable[[str], ModuleType]:
    """Exports ``base`` into ``root``; returns the importer of its modules by today's name
    (``"gateway.engine.engine"`` gives ``<prefix>_gateway.engine``)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", base, "gateway", "state"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    imports = re.compile(r"\b(from|import) (gateway|state)\b")
    for pkg in ("gateway", "state"):
        for path in (root / pkg).rglob("*.py"):
            path.write_text(imports.sub(rf"\1 {prefix}_\2", path.read_text()))
        (root / pkg).rename(root / f"{prefix}_{pkg}")
    sys.path.insert(0, str(root))
    return lambda name: __import__(f"{prefix}_{name}", fromlist=["_"])
