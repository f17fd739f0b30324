"""sdcMicro-shaped commands: ``privgw risk`` (``measure_risk`` + ``suda2``) and ``privgw
kanon`` (``kAnon``). Registered from :mod:`gateway.commands.cli`; each returns data from a workflow
and only formats it here."""

from __future__ import annotations

import argparse
from typing import Any

from gateway.commands.command_kit import add_command, print_json
from gateway.errors import PrivgwError
from gateway.files.fileio import check_output


def _names(text: str, setting: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    if not names:
        raise PrivgwError(f"{setting} needs comma-separated column names, e.g. urbrur,roof,sex")
    if len(set(names)) != len(names):
        raise PrivgwError(f"{setting} names a column twice; name each column once")
    return names


def _tokens(text: str | None) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def _add_missing(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--missing",
        help="comma-separated values that mean missing in the key columns (e.g. '?' in Adult); "
        "an empty cell always does",
    )


def _check_k(k: int, setting: str = "--k") -> int:
    if k < 2:
        raise PrivgwError(f"{setting} must be ≥ 2, got {k}; a class of one record discloses it")
    return k


def _print_risk(s: dict[str, Any]) -> None:
    w = f", weight {s['weight']}" if s["weight"] else ", no weight: risk = 1/fk"
    print(f"{s['records']} records, key ({', '.join(s['keys'])}){w}")
    print(
        f"  expected re-identifications: {s['expected_reidentifications']:.4f} "
        f"({s['global_risk_pct']:.4f} %); global risk {s['global_risk']:.6f}; "
        f"largest individual risk {s['max_individual_risk']:.6f}"
    )
    print(f"  sample uniques (fk = 1): {s['sample_uniques']}")
    for k, v in s["k_anonymity_violations"].items():
        print(f"  records violating {k}-anonymity (fk < {k}): {v}")
    su = s["suda2"]
    sizes = ", ".join(f"size {z}: {c}" for z, c in su["msus_by_size"].items())
    print(
        f"  SUDA2 (MSUs up to {su['max_msu']} variables; DisFraction {su['dis_fraction']}): "
        f"{su['records_with_msu']} records with an MSU ({sizes}); largest score "
        f"{su['max_score']:.0f}, largest DIS score {su['max_dis_score']:.6f}, "
        f"{su['records_dis_above_0.1']} records with DIS > 0.1"
    )


def _print_set(s: dict[str, Any]) -> None:
    """One line per key set: its figures, and a left-out key's change against the full key."""
    d = s.get("change")

    def shown(name: str, spec: str = "", kk: str | None = None) -> str:
        value = s[name] if kk is None else s[name][kk]
        if d is None:
            return f"{value:{spec}}"
        delta = d[name] if kk is None else d[name][kk]
        return f"{value:{spec}} ({delta:+{spec}})"

    label = f"without {s['left_out']}" if "left_out" in s else "+".join(s["keys"])
    violations = ", ".join(
        f"fk < {kk}: {shown('k_anonymity_violations', kk=kk)}" for kk in s["k_anonymity_violations"]
    )
    print(
        f"  {label}: sample uniques {shown('sample_uniques')}, {violations}; expected "
        f"re-identifications {shown('expected_reidentifications', '.4f')}"
    )


def cmd_risk(args: argparse.Namespace) -> int:
    from gateway.files.risk_files import key_sets, risk_file  # noqa: PLC0415

    keys = _names(args.keys, "--keys")
    combos = [
        _names(c.replace("+", ","), "--combinations")
        for c in (args.combinations.split(",") if args.combinations else [])
    ]
    sets = key_sets(keys, by_variable=args.by_variable, combinations=combos)
    if args.output:
        check_output(args.output, inputs=(args.input,))
    summary = risk_file(
        args.input,
        keys,
        weight=args.weight,
        out=args.output,
        k=_check_k(args.k),
        max_msu=args.max_msu,
        dis_fraction=args.dis_fraction,
        sets=sets,
        missing=_tokens(args.missing),
    )
    if args.json:
        print_json(summary)
        return 0
    full = summary["full"] if sets else summary
    _print_risk(full)
    if summary.get("by_variable"):
        print("each key left out (change against all keys):")
        for s in summary["by_variable"]:
            _print_set(s)
    if summary.get("combinations"):
        print("chosen combinations:")
        for s in summary["combinations"]:
            _print_set(s)
    if args.output:
        print(f"  per record (fk, Fk, risk, suda2_score, suda2_dis) -> {args.output}")
    return 0


def cmd_kanon(args: argparse.Namespace) -> int:
    from gateway.files.risk_files import kanon_file  # noqa: PLC0415

    keys = _names(args.keys, "--keys")
    importance = None
    if args.importance:
        try:
            importance = [int(v) for v in args.importance.split(",")]
        except ValueError:
            raise PrivgwError(
                f"--importance must be {len(keys)} whole numbers, one per key in --keys order "
                "(1 = most important, suppressed last), e.g. 1,2,3"
            ) from None
        if sorted(importance) != list(range(1, len(keys) + 1)):
            raise PrivgwError(
                f"--importance must rank the {len(keys)} keys 1..{len(keys)} in --keys order, "
                f"got {args.importance}"
            )
    strata = _names(args.strata, "--strata") if args.strata else None
    check_output(args.output, inputs=(args.input,))
    s = kanon_file(
        args.input,
        keys,
        k=_check_k(args.k),
        out=args.output,
        importance=importance,
        strata=strata,
        missing=_tokens(args.missing),
    )
    if args.json:
        print_json(s)
        return 0
    within = f" within {s['strata_count']} strata of ({', '.join(strata)})" if strata else ""
    print(
        f"{s['k']}-anonymity on ({', '.join(s['keys'])}){within}, a missing value matching any: "
        f"{s['violations_before']} -> {s['violations_after']} records violating; "
        f"{s['suppressed_cells']} cells suppressed in {s['suppressed_records']} records "
        f"({s['seconds']:.3f} s) -> {args.output}"
    )
    imp = dict(zip(s["keys"], s["importance"], strict=True))
    for name, cells in s["suppressed_per_key"].items():
        print(f"  {name} (importance {imp[name]}): {cells} suppressed")
    return 0


def register(sub: Any) -> None:
    """Add ``risk`` and ``kanon`` to the ``privgw`` subcommands."""
    p = add_command(
        sub,
        "risk",
        "frequency risk of a categorical key: fk, Fk, individual and global risk, k-anonymity "
        "violations, SUDA2 and DIS scores (sdcMicro's measure_risk() and suda2())",
        "privgw risk testdata.csv --keys urbrur,roof,walls,water,electcon,relat,sex "
        "--weight sampling_weight -o risk.csv",
    )
    p.add_argument("input", help="input file (.csv or .jsonl)")
    p.add_argument("--keys", required=True, help="comma-separated categorical key columns")
    p.add_argument("--weight", help="sampling weight column (Fk and the individual risk)")
    p.add_argument(
        "--k", type=int, default=5, help="also count violations of this k (default 5; 2, 3 always)"
    )
    p.add_argument(
        "--max-msu", type=int, default=None, help="largest MSU size searched (default: all keys)"
    )
    p.add_argument(
        "--dis-fraction", type=float, default=0.01, help="sampling fraction for the DIS score"
    )
    p.add_argument(
        "--by-variable",
        action="store_true",
        help="also each key left out in turn: its sample uniques, fk < k and expected "
        "re-identifications, and their change against all keys",
    )
    p.add_argument(
        "--combinations",
        help="also these subsets of --keys, each joined by + (e.g. roof+sex,water+relat+sex)",
    )
    p.add_argument(
        "-o",
        "--output",
        help="per-record table (.csv or .jsonl), input order; with --by-variable or "
        "--combinations each key set's columns follow, suffixed [without KEY] or [A+B]",
    )
    _add_missing(p)
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_risk)

    p = add_command(
        sub,
        "kanon",
        "local suppression to k-anonymity of a categorical key, a missing value matching any "
        "category (sdcMicro's kAnon())",
        "privgw kanon testdata.csv --keys urbrur,roof,walls,water,electcon,relat,sex --k 3 "
        "-o testdata.k3.csv",
    )
    p.add_argument("input", help="input file (.csv or .jsonl)")
    p.add_argument("--keys", required=True, help="comma-separated categorical key columns")
    p.add_argument("--k", type=int, required=True, help="k of k-anonymity (≥ 2)")
    p.add_argument(
        "--importance",
        help="rank of each key in --keys order, 1 = most important (suppressed last); default: "
        "fewer categories = more important, as sdcMicro. A key is suppressed only where no "
        "combination of less important keys brings the record to k",
    )
    p.add_argument(
        "--strata",
        help="comma-separated strata columns: k-anonymity within each stratum (sdcMicro's "
        "strataVars); every stratum needs k records",
    )
    p.add_argument("-o", "--output", required=True, help="output file, suppressed cells empty")
    _add_missing(p)
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=cmd_kanon)
