"""The configuration reference and the checks on the environment, as an operator meets them."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.commands.cli import build_parser
from stream_jobs.settings import (
    FLAGS,
    OTHER_VARIABLES,
    WorkerSettings,
    check_environment,
    configuration_reference,
    env_var,
)

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
POLICY = ROOT / "deploy" / "policies" / "adult.yaml"
A_SECRET = "configuration-test-secret-0123456789"  # enough entropy to be accepted


def test_docs_configuration_is_the_generated_reference() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert doc == configuration_reference(), (
        "docs/configuration.md is stale: python -m stream_jobs.settings > docs/configuration.md"
    )
    for name, field in WorkerSettings.model_fields.items():
        assert field.description, f"{name} has no description for the reference"
        assert f"| `{env_var(name)}` |" in doc
    for name in ("PRIVGW_SASL_MECHANISM", "PRIVGW_SSL_CAFILE", "PRIVGW_REPLICATION_FACTOR"):
        assert name in doc
    assert "PRIVGW_CREATE_TOPICS" in doc and "PRIVGW_ENGINE_SHARDS" in doc


def test_every_flag_of_privgw_run_is_a_setting_with_its_variable_in_the_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    run = sub.choices["run"]  # type: ignore[attr-defined]
    helps = {opt: a.help or "" for a in run._actions for opt in a.option_strings}
    for name, flags in FLAGS.items():
        for flag in flags.split(" / "):
            assert flag in helps, f"{flag} is not a flag of privgw run"
            assert env_var(name) in helps[flag], f"{flag}'s help does not name {env_var(name)}"


def test_every_privgw_variable_the_repository_uses_is_known() -> None:
    """Variables read by the code, set by compose or by tests must pass the check."""
    used: set[str] = set()
    for path in [ROOT / "docker-compose.yml", ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        used |= set(re.findall(r"PRIVGW_[A-Z_]*[A-Z](?![A-Z_*])", path.read_text(encoding="utf-8")))
    for folder in ("gateway", "state", "stream_jobs", "tests", "scripts", "bench", "deploy"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".yml", ".yaml", ""} and path != HERE:
                text = path.read_text(encoding="utf-8", errors="replace")
                used |= set(re.findall(r"PRIVGW_[A-Z_]*[A-Z](?![A-Z_*])", text))
    used.discard("PRIVGW_BOOTSTRAP_SERVERS")  # the README's example of a misspelling
    check_environment(dict.fromkeys(used, "x"))
    assert set(OTHER_VARIABLES) <= used


def test_an_unknown_variable_names_the_closest_setting() -> None:
    with pytest.raises(ValueError, match="PRIVGW_BOOTSTRAP_SERVERS: did you mean PRIVGW_BOOTSTRAP"):
        check_environment({"PRIVGW_BOOTSTRAP_SERVERS": "kafka:9092", "PATH": "/bin"})
    with pytest.raises(ValueError, match="did you mean PRIVGW_ENGINE_SHARDS"):
        check_environment({"PRIVGW_ENGINE_SHARD": "2"})
    check_environment({"PRIVGW_SECRET": "s", "PRIVGW_SECRET_FILE": "f", "OTHER_BOOTSTRAP": "x"})


def test_settings_errors_name_the_variable() -> None:
    with pytest.raises(ValidationError, match="PRIVGW_SASL_MECHANISM"):
        WorkerSettings(security_protocol="SASL_SSL")
    with pytest.raises(ValidationError, match="PRIVGW_HEARTBEAT_INTERVAL_MS"):
        WorkerSettings(heartbeat_interval_ms=5000)


def test_json_nesting_is_capped_below_what_the_duplicate_key_check_can_read() -> None:
    """Deeper than Python's recursion allows, the exact duplicate-key check gave up and a key
    given twice behind deep nesting passed with its last value."""
    assert WorkerSettings(max_depth=512).max_depth == 512
    with pytest.raises(ValidationError, match="max_depth"):
        WorkerSettings(max_depth=1000)


def test_no_number_setting_takes_inf_or_nan() -> None:
    """An infinite grace period or timeout waited without bound (a stop that never ends, a
    stall never seen)."""
    numbers = [n for n, f in WorkerSettings.model_fields.items() if f.annotation is float]
    assert {"stall_timeout_seconds", "shutdown_grace_seconds"} <= set(numbers)
    for name in numbers:
        for bad in (math.inf, -math.inf, math.nan):
            with pytest.raises(ValidationError, match="finite number") as err:
                WorkerSettings(**{name: bad})
            assert err.value.errors()[0]["loc"] == (name,)


def run_privgw(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PRIVGW_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=base | env,
        timeout=60,
        check=False,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("privgw: error: "), proc.stderr
    return lines[0]


def test_privgw_run_refuses_a_misspelt_variable_instead_of_using_the_default_broker() -> None:
    line = one_line_error(
        run_privgw(
            "run",
            "--policy",
            str(POLICY),
            PRIVGW_SECRET=A_SECRET,
            PRIVGW_BOOTSTRAP_SERVERS="kafka.example:9092",
        )
    )
    assert "PRIVGW_BOOTSTRAP_SERVERS" in line and "did you mean PRIVGW_BOOTSTRAP?" in line


def test_privgw_run_names_the_variable_of_a_bad_value() -> None:
    line = one_line_error(
        run_privgw("run", "--policy", str(POLICY), PRIVGW_SECRET=A_SECRET, PRIVGW_PARTITIONS="0")
    )
    assert "PRIVGW_PARTITIONS" in line and "greater than or equal to 1" in line
    line = one_line_error(
        run_privgw("run", "--policy", str(POLICY), "--partitions", "0", PRIVGW_SECRET=A_SECRET)
    )
    assert "PRIVGW_PARTITIONS (--partitions)" in line


def test_privgw_version() -> None:
    proc = run_privgw("--version")
    assert proc.returncode == 0
    assert re.fullmatch(r"privgw \d+\.\d+\S* \(Python 3\.\d+\.\d+\)\n", proc.stdout), proc.stdout


def test_privgw_run_names_the_bootstrap_setting_when_kafka_cannot_be_reached() -> None:
    from stream_jobs.commands.broker import free_port  # noqa: PLC0415

    proc = run_privgw(
        "run",
        "--policy",
        str(POLICY),
        "--bootstrap",
        f"127.0.0.1:{free_port()}",  # nothing listens there
        PRIVGW_SECRET=A_SECRET,
        PRIVGW_REQUEST_TIMEOUT_MS="2000",
    )
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("privgw: error:")]
    assert len(errors) == 1, proc.stderr
    assert "--bootstrap" in errors[0] and "PRIVGW_BOOTSTRAP" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
