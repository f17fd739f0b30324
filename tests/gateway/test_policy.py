from pathlib import Path

import pytest

from gateway.errors import PolicyError
from gateway.policy import Method, Role, load_policy, policy_from_yaml

ROOT = Path(__file__).resolve().parents[2]
ADULT = ROOT / "deploy" / "policies" / "adult.yaml"

BASE = """
microaggregation: {k: 3}
attributes:
  age: {role: quasi_identifier, type: numeric, method: microaggregation}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c]
    rr: {mode: uniform, retention: 0.5}
"""


def test_shipped_adult_policy_is_valid() -> None:
    p = load_policy(ADULT)
    assert p.numeric_claim == ["age", "education_num", "hours_per_week"]
    assert p.k_claim == [
        *p.numeric_claim,
        "sex",
        "race",
        "marital_status",
        "relationship",
        "workclass",
        "native_country",
    ]
    assert p.unprotected_quasi_identifiers == []
    assert p.randomized == ["occupation", "income"]
    quasi = {n for n, a in p.attributes.items() if a.role is Role.QUASI_IDENTIFIER}
    assert {"sex", "race", "marital_status"} <= quasi
    assert p.attributes["marital_status"].method is Method.GENERALIZE


def test_version_is_stable_across_layout_and_changes_with_meaning() -> None:
    a = policy_from_yaml(BASE)
    reordered = policy_from_yaml(
        BASE.replace("microaggregation: {k: 3}\n", "") + "microaggregation:\n  k: 3\n"
    )
    assert a.version == reordered.version
    assert len(a.version) == 16
    assert policy_from_yaml(BASE.replace("k: 3", "k: 4")).version != a.version


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE.replace("k: 3", "k: 1"), "microaggregation.k: k must be ≥ 2, got 1"),
        (BASE.replace("k: 3", "k: 3, colour: red"), "microaggregation.colour: unknown key"),
        (
            BASE.replace("retention: 0.5", "retention: 1.5"),
            "rr.retention must be a probability in [0, 1], got 1.5",
        ),
        (BASE.replace("retention: 0.5", "rho1: 0.5, rho2: 0.2"), "0 < rho1 < rho2 < 1"),
        (
            BASE.replace("    categories: [a, b, c]\n", ""),
            "a categorical sensitive needs 'categories'",
        ),
        (BASE.replace("k: 3", "k: three"), "microaggregation.k: Input should be a valid integer"),
        (BASE + "  age: {role: other, type: numeric, method: keep}\n", "key 'age' is given twice"),
        (
            BASE.replace("method: microaggregation", "method: randomized_response"),
            "does not apply to a numeric quasi_identifier",
        ),
        (
            BASE.replace("retention: 0.5", "retention: 0.5, epsilon: 1"),
            "exactly one of retention, epsilon, gamma",
        ),
        (BASE.replace("categories: [a, b, c]", "categories: [a, a, c]"), "lists a value twice"),
        (
            "input: {respondent_id: rid, key_field: ridd}\n" + BASE,
            "input.key_field 'ridd' is neither input.respondent_id nor an attribute",
        ),
        ("attributes: {}", "attributes: Dictionary should have at least 1 item"),
        ("- just\n- a list", "top level must be a mapping"),
        ("attributes: {a: [unclosed", "not valid YAML"),
    ],
)
def test_bad_policies_give_one_clear_error(text: str, expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        policy_from_yaml(text)
    msg = str(err.value)
    assert expected in msg, msg
    assert "\n  " not in msg.split("invalid policy:\n  ", 1)[-1], "one error, not several"


def test_missing_policy_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="policy file not found"):
        load_policy(tmp_path / "nope.yaml")


def test_missing_category_extends_domain() -> None:
    p = load_policy(ADULT)
    occ = p.attributes["occupation"]
    assert occ.domain[-1] == "<missing>"
    assert len(occ.domain) == 15
