"""The engine stays pure and imports point one way: stream_jobs -> state -> gateway."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_GATEWAY = {
    "faust",
    "aiokafka",
    "prometheus_client",
    "asyncio",
    "mode",
    "confluent_kafka",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_gateway_never_imports_io_frameworks_or_upper_layers() -> None:
    offenders = {}
    for path in (ROOT / "gateway").rglob("*.py"):
        bad = _imports(path) & (FORBIDDEN_IN_GATEWAY | {"state", "stream_jobs"})
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


def test_state_never_imports_stream_jobs() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "state").rglob("*.py")
        if "stream_jobs" in _imports(p)
    ]
    assert offenders == []


def test_importing_the_engine_loads_no_io_framework() -> None:
    code = (
        "import sys, gateway.cli, gateway.engine, gateway.files.protect, gateway.files.evaluate;"
        f"bad = sorted(m for m in {sorted(FORBIDDEN_IN_GATEWAY)!r} if m in sys.modules);"
        "print(','.join(bad))"
    )
    # the CLI loads plugin commands via entry points; check the pure modules without them
    out = subprocess.run(
        [sys.executable, "-c", code.replace("gateway.cli, ", "")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout.strip() == ""
