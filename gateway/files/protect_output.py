"""What `privgw protect` prints: the k claim's figures, the frequency risk, and a panel file's
waves (``--state-dir``)."""

from __future__ import annotations

from typing import Any

from gateway.commands.command_kit import fmt


def print_frequency_risk(freq: dict[str, Any] | None) -> None:
    for label in ("original", "published") if freq else ():
        assert freq is not None
        f = freq[label]
        print(
            f"  frequency risk {label} ({len(freq['keys'])} keys, missing matches any): "
            f"expected re-identifications {f['expected_reidentifications']:.2f} "
            f"({f['global_risk_pct']:.3f} %), violating k: "
            + ", ".join(f"{k}: {v}" for k, v in f["k_anonymity_violations"].items())
            + f"; SUDA2 records with an MSU {f['suda2']['records_with_msu']}"
        )


def print_whole_key(key: dict[str, Any]) -> None:
    """The k claim's figures of a protect run: recoding and suppression, or the whole key's
    classes and linkage before and after."""
    if key.get("method") == "recode_suppress":
        print(
            f"  recoding + local suppression on ({', '.join(key['keys'])}): "
            f"{key['suppressed_cells']} cells suppressed in {key['suppressed_records']} records; "
            f"every record matches ≥ {key['min_matches']} records (a missing value matching "
            f"any); records whose exact tuple is shared by < k: {key['strict_records_below_k']}"
        )
        for name, cells in key["suppressed_per_key"].items():
            print(f"  suppressed {name}: {cells}")
    elif key:
        before, after, link = key["whole_key_original"], key["whole_key"], key["whole_key_linkage"]
        print(
            f"  whole key ({len(key['k_claim'])} quasi-identifiers): smallest class "
            f"{before['smallest_class']} -> {after['smallest_class']}, records in classes < k "
            f"{before['share_below_k']:.4f} -> {after['share_below_k']:.4f}, sample uniques "
            f"{before['sample_uniques']} -> {after['sample_uniques']}"
        )
        if link["share_linked"] is None:  # no record kept its key: nothing to link
            print("  whole-key record linkage: none published")
        else:
            print(
                f"  whole-key record linkage: {link['share_linked']:.4f} ± "
                f"{link['standard_error']:.4f} (exact categorical key, then nearest numeric: "
                f"{fmt(link['exact_key_linkage'])})"
            )
        grouping = key.get("grouping", {})
        if "strata" in grouping:
            st = grouping["strata"]
            print(
                f"  strata: {st['strata']}, {st['small_strata']} below k "
                f"({st['records_in_small_strata']} records, {st['small_strata_handling']})"
            )
        if "l_diversity" in grouping:
            ld = grouping["l_diversity"]
            print(
                f"  l-diversity of {ld['attribute']} (l = {ld['l']}): "
                f"{ld['groups_below_l_before']} groups below l merged in {ld['merges']} merges"
            )
        for name, share in key["changed_categories"].items():
            print(f"  changed categories {name}: {fmt(share)}")
        if key["unprotected_quasi_identifiers"]:
            print(
                "  NOT covered by the k claim: " + ", ".join(key["unprotected_quasi_identifiers"])
            )


def print_waves(summary: dict[str, Any], output: str) -> None:
    """One line per wave of a panel file protected on a state."""
    waves = summary["waves"]
    n = len(waves)
    print(f"protected {summary['records']} records, {n} wave{'s' * (n != 1)} -> {output}")
    for wave, w in waves.items():
        again = " (decided before: published again as it was)" if w["again"] else ""
        print(
            f"  wave {wave}{again}: {w['answered']} answered, {w['published']} published "
            f"({w['imputed']} absent members imputed, {w['suppressed']} suppressed)"
        )
    print(f"  metadata for analysts: {summary['meta']}")
