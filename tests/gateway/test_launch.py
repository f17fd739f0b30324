"""SIGTERM during the start: remembered, so that a library swallowing the exception cannot
keep the command running (seen in CI: a worker ran on after a SIGTERM at 0.26 s)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.commands import cli, launch, sigterm

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "adult.yaml"


@pytest.fixture
def fresh_flag(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sigterm._Received, "sigterm", False)
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def _swallowed_by_a_library() -> None:
    with contextlib.suppress(BaseException):  # what a bare ``except:`` does
        launch._early(signal.SIGTERM, None)


def test_a_sigterm_swallowed_while_importing_still_stops_the_command(
    fresh_flag: None, capsys: pytest.CaptureFixture[str]
) -> None:
    _swallowed_by_a_library()
    assert launch.sigterm_received()
    assert cli.main(["check-policy", str(POLICY)]) == 0
    captured = capsys.readouterr()
    assert launch.STOPPED_EARLY in captured.err
    assert captured.out == ""  # the command itself did not run


def test_without_sigterm_the_command_runs(
    fresh_flag: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["check-policy", str(POLICY)]) == 0
    captured = capsys.readouterr()
    assert launch.STOPPED_EARLY not in captured.err
    assert captured.out != ""
