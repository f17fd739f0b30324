"""Role ``weight``: never a key, published as is, rounded or not at all, and used by every
weighted figure (Fk, individual risk, weighted means and totals)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from gateway.errors import PolicyError
from gateway.files.evaluate import evaluate_files
from gateway.files.protect import protect_file
from gateway.policy import load_policy, parse_policy


def _policy(weight: dict, **extra: dict) -> dict:
    return {
        "microaggregation": {"k": 3},
        "attributes": {
            "region": {
                "role": "quasi_identifier",
                "type": "categorical",
                "categories": ["n", "s", "e"],
                "method": "microaggregation",
            },
            "sex": {
                "role": "quasi_identifier",
                "type": "categorical",
                "categories": ["f", "m"],
                "method": "microaggregation",
            },
            "income": {"role": "sensitive", "type": "numeric", "method": "noise",
                       "noise": {"ratio": 0.1}},
            "w": weight,
            **extra,
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        ({"role": "weight", "type": "categorical", "method": "keep"}, "must be type numeric"),
        ({"role": "weight", "type": "numeric", "method": "microaggregation"}, "does not apply"),
        ({"role": "other", "type": "numeric", "method": "keep", "round_to": 1.0}, "round_to"),
        ({"role": "weight", "type": "numeric", "method": "keep", "round_to": -1.0}, "round_to"),
    ],
)
def test_bad_weight_settings_are_one_clear_error(weight: dict, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(_policy(weight))


def test_one_weight_per_policy() -> None:
    w = {"role": "weight", "type": "numeric", "method": "keep"}
    with pytest.raises(PolicyError, match="one sampling weight"):
        parse_policy(_policy(w, w2=w))
    policy = parse_policy(_policy(w))
    assert policy.weight == "w"
    assert "w" not in policy.k_claim


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(5)
    n = 300
    frame = pd.DataFrame(
        {
            "region": rng.choice(["n", "s", "e"], n, p=[0.6, 0.3, 0.1]),
            "sex": rng.choice(["f", "m"], n),
            "income": rng.lognormal(10, 0.5, n).round(2),
            "w": rng.uniform(50, 400, n).round(3),
        }
    )
    src = tmp_path / "in.csv"
    frame.to_csv(src, index=False)
    pol = tmp_path / "policy.yaml"
    weight = {"role": "weight", "type": "numeric", "method": "keep", "round_to": 10.0}
    pol.write_text(yaml.safe_dump(_policy(weight)))
    return src, pol


def test_weight_is_published_rounded_and_weights_every_figure(files, tmp_path) -> None:
    src, pol = files
    policy = load_policy(pol)
    out = tmp_path / "out.csv"
    summary = protect_file(src, policy, out, seed=3)
    orig, prot = pd.read_csv(src), pd.read_csv(out)
    np.testing.assert_allclose(prot["w"], np.round(orig["w"] / 10) * 10)
    assert summary["frequency_risk"]["weight"] == "w"

    result = evaluate_files(src, out, policy)
    # Fk of the original: the sum of the weights of the records sharing the key
    keys = ["region", "sex"]
    fk = orig.groupby(keys)["w"].transform("size").to_numpy(dtype=float)
    pop = orig.groupby(keys)["w"].transform("sum").to_numpy(dtype=float)
    p = fk / pop
    risk = np.where(fk > 2, p / (fk - (1 - p)), np.nan)  # every class here has > 2 records
    assert (fk > 2).all()
    freq = result["frequency_risk"]["original"]
    assert freq["expected_reidentifications"] == pytest.approx(math.fsum(risk), rel=1e-9)
    # weighted totals and means of the noised income, from the original weights
    est = result["weighted_estimates"]["income"]
    w = orig["w"].to_numpy()
    assert est["total_original"] == pytest.approx(math.fsum(w * orig["income"]), rel=1e-12)
    assert est["total_published"] == pytest.approx(math.fsum(w * prot["income"]), rel=1e-12)
    assert est["mean_original"] == pytest.approx(np.average(orig["income"], weights=w), rel=1e-12)
