"""docs/operating.md is the runbook the alerts point to (issue 30, item 6): every alert rule
has a runbook_url, every runbook_url and every link of the runbook resolves (a file that
exists, a heading that exists, as GitHub makes anchors of headings), and every alert has its
own section."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import yaml

from stream_jobs.shutdown import EXIT_BROKER_AWAY

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "operating.md"
RULES = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
ALERTS = [rule for group in RULES["groups"] for rule in group["rules"]]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings: lower case, punctuation dropped, spaces to
    hyphens (a repeated heading gets -1, -2, …)."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"#{1,6} (.+)", line)
        if match is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def resolves(link: str, source: Path) -> bool:
    path, _, anchor = link.partition("#")
    target = (source.parent / path).resolve() if path else source
    if not target.exists():
        return False
    if not anchor:
        return True
    return target.suffix == ".md" and anchor in anchors(target.read_text())


def test_every_alert_links_to_its_own_section_of_the_runbook() -> None:
    sections = anchors(RUNBOOK.read_text())
    for rule in ALERTS:
        url = rule["annotations"].get("runbook_url")
        assert url == f"docs/operating.md#{rule['alert'].lower()}", rule["alert"]
        assert resolves(url, ROOT / "README.md"), url  # relative to the repository root
        assert url.partition("#")[2] in sections


def test_every_link_of_the_runbook_resolves() -> None:
    text = RUNBOOK.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len(links) > 20
    broken = [link for link in links if not link.startswith("http") and not resolves(link, RUNBOOK)]
    assert not broken, broken


def test_the_runbook_covers_what_an_operator_needs() -> None:
    sections = anchors(RUNBOOK.read_text())
    for needed in (
        "install",
        "first-start",
        "the-deployment-secret",
        "backups-and-restore",
        "policy-upgrades",
        "scale-out-and-failover",
        "broker-outages",
        "disk-full-and-state-directory-failures",
        "exit-codes",
        "alerts",
    ):
        assert needed in sections, needed
    text = RUNBOOK.read_text()
    assert f"exits {EXIT_BROKER_AWAY}" in text


def test_the_readme_and_the_dashboard_point_to_the_runbook() -> None:
    assert "docs/operating.md" in (ROOT / "README.md").read_text()
    board = (ROOT / "deploy" / "grafana" / "dashboards" / "privgw.json").read_text()
    assert "docs/operating.md" in board


def test_the_anchor_rules() -> None:
    assert anchors("# A b\n## Disk full and state-directory failures\n```\n# no\n```\n# A b") == {
        "a-b",
        "disk-full-and-state-directory-failures",
        "a-b-1",
    }


def test_the_docs_say_what_is_true_and_date_findings_by_version() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "not wired in yet" not in readme  # group-mode changelog restore works (Scaling out)
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text().lower()
        assert not re.search(r"\b(first|second|third|fourth|fifth|sixth|seventh) session", text), (
            doc.name
        )


def test_every_command_of_the_restore_runbook_exists(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45, item 7: the restore needs no outside tool, and each `privgw …` command the
    section names is one privgw has, with the flags it gives."""
    from gateway.cli import main  # noqa: PLC0415

    text = RUNBOOK.read_text()
    start = text.index("## Backups and restore")
    section = text[start : text.index("\n## ", start + 1)]
    assert "kafka-consumer-groups" not in section
    commands = re.findall(r"`(privgw [^`]+)`", section)
    assert any(c.startswith("privgw offsets reset") for c in commands), commands
    for command in commands:
        words = command.split()[1:]
        sub = list(itertools.takewhile(lambda w: re.fullmatch(r"[a-z][a-z-]*", w), words))
        with pytest.raises(SystemExit) as done:
            main([*sub, "--help"])
        assert done.value.code == 0, command
        usage = capsys.readouterr().out
        for flag in (w for w in words if w.startswith("--")):
            assert flag in usage, (command, flag)
