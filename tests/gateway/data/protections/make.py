"""Writes this folder's fixture with the code of the version before the protection methods
became objects (``BASE``), so that tests/gateway/test_protections_byte_identical.py needs no
git history:

    .venv/bin/python tests/gateway/data/protections/make.py

BASE's ``gateway`` and ``state`` are exported from git and imported under other package names
(as bench/engine_ab.py does); the scenarios are the test module's, run on BASE's modules.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
BASE = "0095fb9"  # main with the if/elif chain in gateway/engine/columns.py
sys.path.insert(0, str(ROOT / "tests" / "gateway"))
sys.path.insert(0, str(HERE.parent))

from base_export import export_base  # noqa: E402
from test_protections_byte_identical import scenarios  # noqa: E402


def _base(root: Path) -> SimpleNamespace:
    mod = export_base(BASE, root, "base33m")
    engine, records = mod("gateway.engine.engine"), mod("gateway.engine.records")
    return SimpleNamespace(
        Engine=engine.Engine,  # type: ignore[attr-defined]
        Keyring=mod("gateway.keyed.keyed").Keyring,  # type: ignore[attr-defined]
        SeededSource=mod("gateway.keyed.randomness").SeededSource,  # type: ignore[attr-defined]
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
