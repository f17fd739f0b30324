"""docs/operating.md is the runbook the alerts point to (issue 30, item 6): every alert rule
has a runbook_url, every runbook_url and every link of the runbook resolves (a file that
exists, a heading that exists, as GitHub makes anchors of headings), and every alert has its
own section."""

from __future__ import annotations

import ast
import contextlib
import io
import itertools
import json
import re
from pathlib import Path

import clikit
import pytest
import yaml

from gateway.commands.cli import EXIT_OK, EXIT_REFUSED, build_parser
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


# -- the runbook matches the code (issue 45): read from the docs and the code, not listed here
README = ROOT / "README.md"
ALERT_NAME = re.compile(r"\bPrivgw[A-Z]\w+")


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    """The cells of the first table under ``heading`` (a line of the document)."""
    lines = markdown.splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not set("".join(cells)) <= set("-: "):  # not the separator row
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # the header row left out


def test_every_alert_of_the_rules_is_in_the_alert_table_and_the_runbook_and_back() -> None:
    rules = {rule["alert"] for rule in ALERTS}
    table = {
        row[0]
        for row in table_rows(RUNBOOK.read_text(), "### Alerts (`deploy/prometheus/alerts.yml`)")
    }
    assert table == rules, (sorted(rules - table), sorted(table - rules))
    named = set(ALERT_NAME.findall(RUNBOOK.read_text())) | set(
        ALERT_NAME.findall(README.read_text())
    )
    assert named <= rules, f"named in the docs, not in alerts.yml: {sorted(named - rules)}"
    headings = set(re.findall(r"^### (Privgw\w+)$", RUNBOOK.read_text(), re.MULTILINE))
    assert headings == rules, (sorted(rules - headings), sorted(headings - rules))


def exit_constants() -> dict[str, int]:
    """Every module-level ``EXIT_* = N`` of the code."""
    found: dict[str, int] = {}
    for package in ("gateway", "state", "stream_jobs"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, int)
                ):
                    for target in node.targets:
                        if isinstance(target, ast.Name) and target.id.startswith("EXIT_"):
                            found[f"{path.stem}.{target.id}"] = node.value.value
    return found


def runbook_exit_codes() -> dict[int, str]:
    rows = table_rows(RUNBOOK.read_text(), "## Exit codes")
    return {int(row[0]): row[1] for row in rows}


def test_every_exit_code_of_the_runbook_is_a_constant_of_the_code_and_back() -> None:
    documented = runbook_exit_codes()
    constants = exit_constants()
    assert len(documented) >= 5
    assert set(documented) == set(constants.values()), (documented, constants)


privgw = clikit.privgw


def test_the_exit_codes_the_runbook_gives_are_observed(tmp_path: Path) -> None:
    """The cheap ones: a clean command and a refusal (141, a reader that went away, is observed
    by tests/gateway/test_cli_manners.py; the worker's own, 1 and 75, by tests/stream_jobs)."""
    documented = runbook_exit_codes()
    ok = privgw("check-policy", "deploy/policies/adult.yaml")
    assert ok.returncode == EXIT_OK and "cleanly" in documented[ok.returncode]
    refused = privgw("check-policy", tmp_path / "missing.yaml")
    assert refused.returncode == EXIT_REFUSED, refused.stderr
    assert "privgw: error:" in refused.stderr and "privgw: error:" in documented[EXIT_REFUSED]


def runbook_commands() -> list[list[str]]:
    """The words after ``privgw`` in every code span and block of the runbook."""
    text = RUNBOOK.read_text()
    spans = re.findall(r"```[^\n]*\n(.*?)```", text, re.DOTALL)
    spans += re.findall(r"(?<!`)`([^`]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    commands = []
    for span in spans:
        for match in re.finditer(r"(?:^|[\s(;])privgw((?:[ \t]+|\n[ \t]*)[^\s`]+)+", span):
            words = match.group(0).split()[1:]
            if words and re.fullmatch(r"[a-z][a-z-]*", words[0]):
                commands.append(words)
    return commands


def test_every_privgw_command_of_the_runbook_exists_with_its_options() -> None:
    parser = build_parser()

    def help_of(path: list[str]) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            parser.parse_args([*path, "--help"])
        return out.getvalue()

    commands = runbook_commands()
    assert len(commands) >= 6, commands
    for words in commands:
        path: list[str] = []
        text = help_of(path)
        for word in words:
            # the subcommands a help lists: indented by 4 (options by 2, wrapped text by more)
            choices = re.findall(r"^ {4}([a-z][\w-]*)(?: {2,}|$)", text, re.MULTILINE)
            if not choices or word.startswith("-"):
                break
            assert word in choices, f"privgw {' '.join(words)}: no {word!r} in {choices}"
            path.append(word)
            text = help_of(path)
        assert path, f"privgw {' '.join(words)}: not a command"
        for word in words:
            flag = word.split("=", 1)[0]
            if flag.startswith("--"):
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
                    f"privgw {' '.join(path)} has no {flag}"
                )


def test_the_secret_rotation_panel_says_the_count_is_kept_on_the_metadata_topic() -> None:
    """privgw_secret_rotations_total starts from the rotations the metadata topic announces
    (stream_jobs.secret.secret_announce): the panel and the runbook's dashboard table must not call
    it a count since the workers started."""
    board = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "privgw.json").read_text())
    (panel,) = [
        p
        for p in board["panels"]
        if "privgw_secret_rotations_total" in json.dumps(p.get("targets", []))
    ]
    (row,) = [
        r
        for r in table_rows(RUNBOOK.read_text(), '### The dashboard ("privgw — privacy gateway")')
        if r[0] == "Secret rotations"
    ]
    for text in (panel["title"], panel["description"], row[1]):
        assert "since the workers started" not in text
        assert "restart" in text.lower() or "history" in text
    assert "metadata topic" in panel["description"] and "metadata topic" in row[1]
    assert "metadata topic" in (ROOT / "stream_jobs" / "secret" / "secret_announce.py").read_text()


def test_every_command_of_the_restore_runbook_exists(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 45, item 7: the restore needs no outside tool, and each `privgw …` command the
    section names is one privgw has, with the flags it gives."""
    from gateway.commands.cli import main  # noqa: PLC0415

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


def test_the_readme_is_a_guide_of_at_most_250_lines() -> None:
    """Issue 47: figures, tuning and history live in docs/; the README says what privgw is, its
    two commands, its three jobs with a link each, and one architecture picture."""
    readme = README.read_text()
    assert readme.count("\n") <= 250
    for link in ("docs/streaming.md", "docs/consistency.md", "docs/operating.md"):
        assert f"]({link}" in readme, link
    assert "```mermaid" in readme and "](docs/architecture.md)" in readme
