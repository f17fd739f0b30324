"""The file workflow's commands: ``privgw protect``, ``microaggregate``, ``evaluate``,
``ru-map``, ``reconstruct`` and ``attack``, each a thin front end over a workflow function that
returns data (:mod:`gateway.files`), registered on ``privgw``'s subcommands by :func:`register`."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys
from pathlib import Path
from typing import Any

from gateway.commands.command_kit import add_command, fmt, print_json, wave_number, wave_pair
from gateway.errors import PrivgwError
from gateway.files.analysis import (
    attack_history,
    attack_k,
    attack_qi,
    change_file,
    check_history,
    history_meta,
    read_jsonl_rows,
    reconstruct_file,
    release_counts,
)
from gateway.files.evaluate import evaluate_files
from gateway.files.fileio import PICTURE_SUFFIXES, check_output
from gateway.files.panel_file import check_waved, protect_waves
from gateway.files.protect import meta_path, microaggregate_file
from gateway.files.protect_blocks import DEFAULT_BUDGET_MIB, Budget, protect_within
from gateway.files.protect_output import print_frequency_risk, print_waves, print_whole_key
from gateway.files.ru_map import plot_ru_map, ru_map
from gateway.policy import load_policy

log = logging.getLogger("privgw")


def _entry_point(group: str, name: str) -> Any:
    for ep in importlib.metadata.entry_points(group=group):
        if ep.name == name:
            return ep.load()
    raise PrivgwError(f"'{name}' support is not installed (pip install privgw with its extras)")


def cmd_protect(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    if args.seed is not None and args.seed < 0:
        raise PrivgwError(f"--seed must be a whole number ≥ 0, got {args.seed}")
    if args.state_dir is not None:
        check_waved(policy, args.seed)  # before the output is checked: the settings first
    elif args.policy_upgrade is not None:
        raise PrivgwError("--policy-upgrade upgrades a state: give it with --state-dir DIR")
    # OUT.meta.json too: a symlink there, or an input of that name, would be overwritten
    meta = meta_path(args.output)
    check_output(args.output, inputs=(args.input, args.policy), companions=(meta,))
    if args.state_dir is not None:
        opener = _entry_point("privgw.stores", "sqlite")
        state_dir = Path(args.state_dir)
        summary = protect_waves(
            args.input, policy, args.output, state_dir, opener, accept=args.policy_upgrade
        )
        print_waves(summary, args.output)
        return 0
    budget = Budget(memory_mib=args.memory_budget, block_rows=args.block_rows)
    summary = protect_within(args.input, policy, args.output, seed=args.seed, budget=budget)
    cells = summary["whole_key"].get("suppressed_cells", 0)
    grouping = (
        f"keys recoded, {cells} key cells suppressed one by one"
        if summary["groups"] is None
        else f"{summary['groups']} groups, smallest {summary['min_group_size']}"
    )
    print(
        f"protected {summary['published']} of {summary['records']} records -> {args.output} "
        f"(policy {summary['policy_version']}; {grouping}; {summary['suppressed']} suppressed)"
    )
    if "blocks" in summary:
        b = summary["blocks"]
        print(
            f"  in {b['blocks']} blocks of {b['smallest']}..{b['largest']} rows (at most "
            f"{b['max_rows']}: --memory-budget); risk figures per block, summed (upper bounds)"
        )
    numeric_only = {"sse_sst_pct", "il1s", "dld", "interval_disclosure"}
    for name, value in summary["measures"].items():
        label = (
            f"{name} (numeric quasi-identifiers: {', '.join(policy.numeric_claim)})"
            if name in numeric_only
            else name
        )
        print(f"  {label}: {fmt(value)}")
    for name, value in summary["retention"].items():
        print(f"  retention {name}: {fmt(value)}")
    print_whole_key(summary["whole_key"])
    print_frequency_risk(summary.get("frequency_risk"))
    print(f"  metadata for analysts: {summary['meta']}")
    return 0


def cmd_microaggregate(args: argparse.Namespace) -> int:
    cols = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    check_output(args.output, inputs=(args.input,))
    s = microaggregate_file(
        args.input,
        args.output,
        k=args.k,
        columns=cols,
        algorithm=args.algorithm,
        standardize=not args.no_standardize,
        strata=[c.strip() for c in args.strata.split(",") if c.strip()] if args.strata else None,
    )
    print(
        f"microaggregated {s['records']} records on {', '.join(s['columns'])} with k={args.k}: "
        f"{s['groups']} groups of {s['min_group_size']}..{s['max_group_size']}, "
        f"100·SSE/SST = {s['sse_sst_pct']:.2f} -> {args.output}"
    )
    if "strata" in s:
        st = s["strata"]
        print(
            f"  within {st['strata']} strata; {st['small_strata']} below k "
            f"({st['records_in_small_strata']} records) pooled"
        )
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy) if args.policy else None
    if args.p is not None and not 0.0 < args.p <= 100.0:  # also nan
        raise PrivgwError(f"--p must be a percentage in (0, 100], e.g. 10; got {args.p}")
    if args.report:
        if policy is None:
            raise PrivgwError("--report needs --policy (it names the attributes to tabulate)")
        check_output(
            args.report,
            suffixes=frozenset({".html"}),
            inputs=(args.original, args.protected),
            setting="--report",
        )
    result = evaluate_files(args.original, args.protected, policy, p_pct=args.p)
    if args.report:
        from gateway.files.utility_report import build_report  # noqa: PLC0415 - matplotlib

        assert policy is not None
        page = build_report(
            args.original,
            args.protected,
            policy,
            result,
            policy_path=args.policy,
            out=args.report,
        )
        Path(args.report).write_text(page, encoding="utf-8")
        print(f"utility report -> {args.report}", file=sys.stderr)
    if args.json:
        print_json(result)
        return 0
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k2, v2 in value.items():
                print(f"  {k2}: {fmt(v2)}")
        else:
            print(f"{key}: {fmt(value)}")
    return 0


def cmd_ru_map(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    try:
        ks = [int(k) for k in args.k.split(",")]
    except ValueError:
        raise PrivgwError(
            f"--k must be a comma-separated list of integers, got '{args.k}'"
        ) from None
    check_output(args.output, suffixes=PICTURE_SUFFIXES, inputs=(args.input, args.policy))
    rows = ru_map(args.input, policy, ks)
    nan = float("nan")
    print(
        f"{'k':>4} {'IL(SSE/SST%)':>13} {'IL1s':>8} {'changed':>8} {'DLD':>8} {'ID':>8} "
        f"{'DR':>8} {'score':>8} {'whole-key linkage':>18} {'E(re-id)':>9}"
    )
    print(f"{'':>4} {'numeric QIs':>13} {'':>8} {'categ.':>8} {'numeric QIs only':>26}")
    for r in rows:
        print(
            f"{int(r['k']):>4} {r.get('il', nan):>13.3f} {r.get('il1s', nan):>8.4f} "
            f"{r['changed_categories']:>8.4f} {r.get('dld', nan):>8.4f} "
            f"{r.get('interval_disclosure', nan):>8.4f} {r.get('dr', nan):>8.4f} "
            f"{r.get('score', nan):>8.4f} {r['whole_key_linkage']:>18.4f} "
            f"{r['expected_reidentifications']:>9.3f}"
        )
    plot_ru_map(rows, args.output)
    print(f"R-U map -> {args.output}")
    return 0


def cmd_reconstruct(args: argparse.Namespace) -> int:
    if args.change is not None:
        if args.bootstrap or not args.protected or not args.policy:
            raise PrivgwError("--change reads a panel file: give PROTECTED --policy P")
        changes = change_file(args.protected, load_policy(args.policy), args.change)
        if args.json:
            print_json(changes)
            return 0
        for name, est in changes.items():
            print(
                f"{name} (waves {args.change[0]} -> {args.change[1]}, {est['pairs']} linked "
                f"pairs): gross change {est['gross_change']:.4f} ± {est['gross_change_se']:.4f}"
            )
            cats = est["categories"]
            print(f"  {'from / to':>20} " + " ".join(f"{c[:10]:>10}" for c in cats))
            for c, row in zip(cats, est["joint"], strict=True):
                print(f"  {c[:20]:>20} " + " ".join(f"{v:>10.4f}" for v in row))
        return 0
    if args.bootstrap:
        if not args.topic:
            raise PrivgwError("--bootstrap needs --topic (the protected topic)")
        meta_topic = args.meta_topic
        if meta_topic is None and args.policy:
            policy = load_policy(args.policy)
            if args.topic == policy.output.topic:
                meta_topic = policy.meta_topic
        # streamed: per-version category counts, never the topic's rows
        reader = _entry_point("privgw.readers", "counts")
        counts = reader(args.bootstrap, args.topic, meta_topic=meta_topic, wave=args.wave)
        for version, n in counts.without_meta().items():
            log.warning(
                "policy version %s: no metadata record in %s; its %d rows are left out of "
                "every estimate (give the right metadata topic with --meta-topic)",
                version,
                meta_topic or f"{args.topic}.meta",
                n,
            )
        for why, n in counts.skipped().items():  # a stream is not trusted: never fatal
            log.warning("%d %s in %s: left out", n, why.replace("_", " "), args.topic)
        result = counts.reconstruct()
        if not result:
            raise PrivgwError(
                f"no randomized values to reconstruct from in {args.topic} (rows per policy "
                f"version: {counts.rows or 'none'})"
            )
    else:
        if not args.protected or not args.policy:
            raise PrivgwError("give PROTECTED --policy P, or --bootstrap B --topic T")
        result = reconstruct_file(args.protected, load_policy(args.policy), wave=args.wave)
    if args.json:
        print_json(result)
        return 0
    for name, est in result.items():
        groups = est.get("groups", [])
        # the attribute's header always: without a combined estimate (versions that publish
        # different categories) its groups' tables came out under the attribute before
        versions = f"; {len(groups)} matrices" if len(groups) > 1 else ""
        print(f"{name} (n = {est['n']}{versions}):")
        if "categories" in est:
            _print_estimate(est)
        for g in groups if len(groups) > 1 or "categories" not in est else ():
            print(f"  policy versions {', '.join(g['policy_versions'])} (n = {g['n']}):")
            _print_estimate(g)
        for note in est.get("notes", []):
            print(f"  note: {note}")
    return 0


def _print_estimate(est: Any) -> None:
    print(f"  {'category':>20} {'observed':>9} {'inversion':>10} {'±se':>7} {'EM':>8} {'±se':>7}")
    for i, c in enumerate(est["categories"]):
        print(
            f"  {c[:20]:>20} {est['observed'][i]:>9.4f} {est['inversion'][i]:>10.4f} "
            f"{est['inversion_se'][i]:>7.4f} {est['em'][i]:>8.4f} {est['em_se'][i]:>7.4f}"
        )


def cmd_attack(args: argparse.Namespace) -> int:
    if args.bootstrap:
        reader = _entry_point("privgw.readers", "kafka")
        meta, history = reader(args.bootstrap, args.topic)
    elif not args.history:
        raise PrivgwError("give the history as JSONL files, or --bootstrap B --topic T")
    else:
        meta, history = history_meta(args.history), read_jsonl_rows(args.history)
    sticky = [c for c in (args.sticky or "").split(",") if c]
    if args.truth is None and not sticky:
        raise PrivgwError(
            "give --truth (the simulator's ground truth) for the averaging and intersection "
            "adversaries, or --sticky COL[,COL] for the sticky-value intruder, or both"
        )
    truth = read_jsonl_rows([args.truth]) if args.truth is not None else []
    qi = attack_qi(args.qi, meta, sticky=bool(sticky), averaging=bool(truth and args.attribute))
    k = attack_k(args.k, meta)
    ts = release_counts(args.t)
    check_history(history, truth, [*qi, *sticky, *([args.attribute] if args.attribute else [])])
    result = attack_history(
        history, truth, attribute=args.attribute, qi_columns=qi, k=k, ts=ts, sticky=sticky
    )
    if args.json:
        print_json(result)
        return 0
    print(f"{result['releases']} releases, {result['records']} records")
    if changed := result.get("averaging_changed_excluded"):
        print(f"averaging: {changed} respondents whose answer changed left out (no one truth)")
    for p in result.get("averaging", []):
        lo, hi = p["ci95"]
        print(
            f"averaging T={p['T']:>4}: accuracy {p['accuracy']:.4f} "
            f"(95% CI {lo:.4f}..{hi:.4f}, {p['respondents']} respondents)"
        )
    if "sticky_linkage" in result:
        c = result["sticky_linkage"]
        print(
            f"sticky-value intruder (follows respondents by {','.join(c['sticky'])}, knows who "
            f"took part): {c['below_k']} of {c['chains']} followed respondents linked to fewer "
            f"than k={c['k']}, {c['isolated']} isolated; smallest sets "
            f"{c['smallest_candidate_sets']}"
        )
    if "intersection" in result:
        i = result["intersection"]
        print(
            f"linked candidate sets (intersection over every release a respondent published "
            f"in): {i['below_k']} of {i['respondents']} respondents below k={i['k']} "
            f"({100 * i['share_below_k']:.1f} %), {i['singled_out']} singled out, median "
            f"{i['median']:g}; smallest sets {i['smallest_candidate_sets']}"
        )
    return 0


def register(sub: Any) -> None:
    """Add the file workflow's commands to the ``privgw`` subcommands."""
    _add_protect(sub)
    _add_microaggregate(sub)
    _add_evaluate(sub)
    _add_ru_map(sub)
    _add_reconstruct(sub)
    _add_attack(sub)


def _add_protect(sub: Any) -> None:
    p = add_command(
        sub,
        "protect",
        "protect a CSV/JSONL file with a policy",
        "privgw protect adult.csv --policy adult.yaml -o adult.protected.csv --seed 1",
    )
    p.add_argument("input", help="input file (.csv or .jsonl)")
    p.add_argument("--policy", required=True, help="policy YAML")
    p.add_argument("-o", "--output", required=True, help="output file (.csv or .jsonl)")
    p.add_argument("--seed", type=int, default=None, help="seed for a reproducible run")
    p.add_argument(
        "--memory-budget",
        type=int,
        default=DEFAULT_BUDGET_MIB,
        metavar="MIB",
        help="memory to stay within (MiB); a larger file is protected in blocks of its key "
        f"space (default {DEFAULT_BUDGET_MIB})",
    )
    p.add_argument(
        "--block-rows",
        type=int,
        default=None,
        help="rows a block holds at most (overrides --memory-budget's)",
    )
    p.add_argument(
        "--state-dir",
        default=None,
        help="publish the file's waves (republication.wave_attribute) as successive releases "
        "on this state, as the stream does, for a later file to continue; the secret comes "
        "from PRIVGW_SECRET_FILE (--memory-budget and --block-rows do not apply: each wave is "
        "decided whole)",
    )
    p.add_argument(
        "--policy-upgrade",
        metavar="VERSION",
        default=None,
        help="with --state-dir: accept this policy version as an upgrade of the one the state "
        "was written under, migrating the state (review `privgw policy diff` first)",
    )
    p.set_defaults(func=cmd_protect)


def _add_microaggregate(sub: Any) -> None:
    p = add_command(
        sub,
        "microaggregate",
        "MDAV microaggregation of numeric columns (sdcMicro's microaggregation() equivalent)",
        "privgw microaggregate census.csv --k 3 -o census.k3.csv",
    )
    p.add_argument("input", help="input file (.csv or .jsonl)")
    p.add_argument("--k", type=int, required=True, help="minimum group size (≥ 2)")
    p.add_argument("-o", "--output", required=True, help="output file (.csv or .jsonl)")
    p.add_argument("--columns", help="comma-separated columns (default: all numeric)")
    p.add_argument(
        "--algorithm",
        choices=["mdav", "ranking"],
        default="mdav",
        help="mdav (multivariate, default) or ranking (individual ranking, column by column)",
    )
    p.add_argument("--no-standardize", action="store_true", help="distances on raw values")
    p.add_argument("--strata", help="comma-separated strata columns: groups never cross a stratum")
    p.set_defaults(func=cmd_microaggregate)


def _add_evaluate(sub: Any) -> None:
    p = add_command(
        sub,
        "evaluate",
        "information loss and disclosure risk of a protected file",
        "privgw evaluate census.csv census.k3.csv --json",
    )
    p.add_argument("original", help="the original file (.csv or .jsonl)")
    p.add_argument("protected", help="its protected version (same records, same order)")
    p.add_argument("--policy", help="policy (selects attributes, adds RR retention)")
    p.add_argument("--p", type=float, default=None, help="interval disclosure p%% (default 10)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument(
        "--report",
        help="write one HTML page (tables, plots, the commands) for analysts; needs --policy",
    )
    p.set_defaults(func=cmd_evaluate)


def _add_ru_map(sub: Any) -> None:
    p = add_command(
        sub,
        "ru-map",
        "R-U map: information loss vs disclosure risk per k",
        "privgw ru-map adult.csv --policy deploy/policies/adult.yaml --k 2,3,4,5,6,8,10 -o ru.png",
    )
    p.add_argument("input", help="input file (.csv or .jsonl)")
    p.add_argument("--policy", required=True, help="policy YAML (its k is replaced by each k)")
    p.add_argument("--k", default="2,3,4,5,6,8,10", help="comma-separated k values (%(default)s)")
    p.add_argument("-o", "--output", required=True, help="PNG picture")
    p.set_defaults(func=cmd_ru_map)


def _add_reconstruct(sub: Any) -> None:
    p = add_command(
        sub,
        "reconstruct",
        "estimate the true distributions of randomized attributes",
        "privgw reconstruct adult.protected.csv --policy deploy/policies/adult.yaml\n"
        "  privgw reconstruct --bootstrap 127.0.0.1:9092 --topic survey.protected",
    )
    p.add_argument("protected", nargs="?", help="protected file (reads PROTECTED.meta.json too)")
    p.add_argument(
        "--policy",
        help="policy YAML (with a file: needed; with --topic: finds its metadata topic)",
    )
    p.add_argument("--bootstrap", help="read the protected topic and its .meta topic instead")
    p.add_argument(
        "--topic",
        help="protected topic (with --bootstrap): read as a stream, each policy version's rows "
        "reconstructed with that version's metadata",
    )
    p.add_argument(
        "--meta-topic",
        help="metadata topic (with --topic; default: the policy's meta topic when --policy "
        "names that output topic, else TOPIC.meta)",
    )
    p.add_argument(
        "--wave",
        type=wave_number,
        help="only this release's rows (the policy's wave attribute); without it the rows of "
        "every release are pooled, their standard errors counting each respondent once",
    )
    p.add_argument(
        "--change",
        metavar="W1,W2",
        type=wave_pair,
        help="a panel file's gross change between two waves: each respondent's records linked "
        "by its pseudonym (output.pseudonym: hmac), under sticky draws (an unchanged answer "
        "publishes the same value); the true transitions' shares ± se",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_reconstruct)


def _add_attack(sub: Any) -> None:
    p = add_command(
        sub,
        "attack",
        "simulate the averaging and intersection adversaries on a history",
        "privgw attack out/*.jsonl --truth truth.jsonl --attribute occupation --t 1,5,20",
    )
    p.add_argument("history", nargs="*", help="published records (JSONL/CSV with record_id, wave)")
    p.add_argument("--truth", help="JSONL: record_id, respondent_id, true values")
    p.add_argument(
        "--sticky",
        help="published sensitive columns the participation-aware intruder follows "
        "respondents by (e.g. occupation,income,capital_gain,capital_loss)",
    )
    p.add_argument("--attribute", help="randomized attribute for the averaging adversary")
    p.add_argument("--qi", help="published quasi-identifier columns (default: from metadata)")
    p.add_argument("--k", type=int, help="k (default: from metadata)")
    p.add_argument("--t", default="1,5,20,100", help="numbers of releases T")
    p.add_argument("--bootstrap", help="read the history from a protected topic instead")
    p.add_argument("--topic", help="protected topic to read (with --bootstrap)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_attack)
