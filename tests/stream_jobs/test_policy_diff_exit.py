"""`privgw policy diff` exits as diff(1) does, as docs/operating.md says (issue 45, item 9: the
exit 1 on a change was not documented): 0 same, 1 changed, 2 an error; run as a user runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "deploy" / "policies" / "adult.yaml"


def _diff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "policy", "diff", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_policy_diff_exits_0_same_1_changed_2_error_as_documented(tmp_path: Path) -> None:
    doc = " ".join((ROOT / "docs" / "operating.md").read_text().split())
    said = re.search(r"It exits as diff\(1\) does: 0 when (.*?), 1 when (.*?), 2 on an error", doc)
    assert said, "docs/operating.md no longer gives policy diff's exit codes"
    k6 = tmp_path / "k6.yaml"
    text = ADULT.read_text()
    assert "  k: 5\n" in text, "the Adult policy changed: update this test"
    k6.write_text(text.replace("  k: 5\n", "  k: 6\n", 1))
    same = _diff("--from", ADULT, "--policy", ADULT)
    assert same.returncode == 0, same.stderr
    changed = _diff("--from", ADULT, "--policy", k6)
    assert changed.returncode == 1 and "k 5 -> 6" in changed.stdout, changed.stderr
    assert _diff("--from", ADULT, "--policy", k6, "--json").returncode == 1
    missing = _diff("--from", ADULT, "--policy", tmp_path / "nope.yaml")
    assert missing.returncode == 2 and missing.stderr.startswith("privgw: error:")
