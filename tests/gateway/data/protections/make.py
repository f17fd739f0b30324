"""Writes this folder's fixture with the code of the version before the protection methods
became objects (``BASE``), so that tests/gateway/test_protections_byte_identical.py needs no
git history:

    .venv/bin/python tests/gateway/data/protections/make.py

BASE's ``gateway`` and ``state`` are exported from git and imported under other package names
(as bench/engine_ab.py does); the scenarios are the test module's, run on BASE's modules.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
BASE = "0095fb9"  # main with the if/elif chain in gateway/columns.py
sys.path.insert(0, str(ROOT / "tests" / "gateway"))

from test_protections_byte_identical import scenarios  # noqa: E402


def _base(root: Path) -> SimpleNamespace:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", BASE, "gateway", "state"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    imports = re.compile(r"\b(from|import) (gateway|state)\b")
    for pkg in ("gateway", "state"):
        for path in (root / pkg).rglob("*.py"):
            path.write_text(imports.sub(r"\1 base33m_\2", path.read_text()))
        (root / pkg).rename(root / f"base33m_{pkg}")
    sys.path.insert(0, str(root))

    def mod(name: str) -> object:
        return __import__(f"base33m_{name}", fromlist=["_"])

    engine, records = mod("gateway.engine"), mod("gateway.records")
    return SimpleNamespace(
        Engine=engine.Engine,  # type: ignore[attr-defined]
        Keyring=mod("gateway.keyed").Keyring,  # type: ignore[attr-defined]
        SeededSource=mod("gateway.randomness").SeededSource,  # type: ignore[attr-defined]
        ValidRecord=records.ValidRecord,  # type: ignore[attr-defined]
        SourceRef=records.SourceRef,  # type: ignore[attr-defined]
        policy_from_yaml=mod("gateway.policy").policy_from_yaml,  # type: ignore[attr-defined]
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        got = scenarios(_base(Path(tmp)))
    expected = {"base": BASE, "scenarios": got}
    (HERE / "expected.json").write_bytes(orjson.dumps(expected, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
