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
        "import sys, gateway.commands.cli, gateway.engine.engine, "
        "gateway.files.protect, gateway.files.evaluate;"
        f"bad = sorted(m for m in {sorted(FORBIDDEN_IN_GATEWAY)!r} if m in sys.modules);"
        "print(','.join(bad))"
    )
    # the CLI loads plugin commands via entry points; check the pure modules without them
    out = subprocess.run(
        [sys.executable, "-c", code.replace("gateway.commands.cli, ", "")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert out.stdout.strip() == ""


# issue 33's layout: a module is read whole, a function on one screen
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for d in ("gateway", "stream_jobs") for p in (ROOT / d).rglob("*.py"))


def test_no_module_of_the_engine_or_the_worker_is_over_500_lines() -> None:
    lines = {p: p.read_text(encoding="utf-8").count("\n") for p in _sources()}
    too_long = {str(p.relative_to(ROOT)): n for p, n in lines.items() if n > MAX_MODULE_LINES}
    assert lines, "no sources found"
    assert too_long == {}


def test_no_function_of_the_engine_or_the_worker_is_over_80_lines() -> None:
    too_long = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long[f"{path.relative_to(ROOT)}:{node.name}"] = length
    assert too_long == {}


# issue 47: imports point one way between modules too, so each module reads on its own
def _module_names() -> dict[str, Path]:
    names = {}
    for d in ("gateway", "state", "stream_jobs"):
        for path in (ROOT / d).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imported_modules(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``path`` imports anywhere: at its top, inside functions,
    under ``TYPE_CHECKING``; ``from package import module`` counts as the module."""

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(owner(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(owner(f"{node.module}.{a.name}") for a in node.names)
    return {name for name in found if name is not None}


def test_no_two_modules_import_each_other() -> None:
    known = _module_names()
    imports = {name: _imported_modules(path, known) - {name} for name, path in known.items()}
    pairs = sorted(
        f"{a} <-> {b}" for a, deps in imports.items() for b in deps if a < b and a in imports[b]
    )
    assert len(known) > 100, "no sources found"
    assert pairs == []


# issue 47: the top of the engine and of the worker shows the data flow; modules go in subpackages
MAX_LOOSE_MODULES = 8


def test_at_most_8_loose_modules_at_the_top_of_gateway_and_stream_jobs() -> None:
    loose = {
        d: sorted(p.stem for p in (ROOT / d).glob("*.py") if p.stem not in ("__init__", "__main__"))
        for d in ("gateway", "stream_jobs")
    }
    assert all(names for names in loose.values()), "no sources found"
    too_many = {d: names for d, names in loose.items() if len(names) > MAX_LOOSE_MODULES}
    assert too_many == {}
