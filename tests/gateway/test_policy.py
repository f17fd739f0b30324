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


def test_a_setting_added_later_changes_the_version_only_once_set() -> None:
    """A policy keeps its version when privgw learns a new setting (the byte-identical
    upgrade fixtures pin versions written before it); setting it is a change of meaning."""
    plain = policy_from_yaml(BASE)
    idle = policy_from_yaml(BASE + "window: {max_seconds: 5, max_idle_seconds: 0.5}\n")
    same_window = policy_from_yaml(BASE + "window: {max_seconds: 5}\n")
    assert same_window.version == plain.version
    assert idle.version != plain.version
    unset = policy_from_yaml(BASE.replace("k: 3", "k: 3, standardize: true"))
    assert unset.microaggregation.refine is None and unset.version == plain.version
    versions = {
        policy_from_yaml(BASE.replace("k: 3", f"k: 3, refine: {v}")).version
        for v in ("true", "false")
    }
    assert len(versions) == 2 and plain.version not in versions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE.replace("k: 3", "k: 1"), "microaggregation.k: k must be ≥ 2, got 1"),
        (BASE.replace("k: 3", "k: 3, colour: red"), "microaggregation.colour: unknown key"),
        (
            BASE.replace("k: 3", "k: 3, algorithm: ranking, refine: true"),
            "microaggregation.refine improves MDAV's groups, not ranking's; remove refine",
        ),
        (
            BASE.replace("retention: 0.5", "retention: 1.5"),
            "rr.retention must be a probability in [0, 1], got 1.5",
        ),
        (BASE.replace("retention: 0.5", "rho1: 0.5, rho2: 0.2"), "0 < rho1 < rho2 < 1"),
        (
            BASE.replace("    categories: [a, b, c]\n", ""),
            "a categorical sensitive needs 'categories'",
        ),
        (BASE.replace("k: 3", "k: three"), "microaggregation.k: must be a whole number"),
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


@pytest.mark.parametrize("source", ["/dev/zero", "oversized"])
def test_a_policy_file_past_the_size_cap_is_refused_unread(tmp_path: Path, source: str) -> None:
    """Issue 45, item 9: a policy read from /dev/zero ran out of memory (exit 70, or killed)."""
    path = Path(source)
    if source == "oversized":  # a valid policy behind 1.1 MB of comments: still refused
        path = tmp_path / "big.yaml"
        path.write_text("# padding\n" * 110_000 + ADULT.read_text())
    with pytest.raises(PolicyError, match=f"policy file {path} is larger than the 1024 KiB"):
        load_policy(path)


def test_missing_category_extends_domain() -> None:
    p = load_policy(ADULT)
    occ = p.attributes["occupation"]
    assert occ.domain[-1] == "<missing>"
    assert len(occ.domain) == 15


MATRIX = BASE.replace(
    "rr: {mode: uniform, retention: 0.5}",
    "rr: {mode: matrix, matrix: [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]}",
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # topics with two roles: raw dead letters in the protected stream, feedback loops
        (
            "output: {topic: out, dlq_topic: out}\n" + BASE,
            "output.dlq_topic names the same topic as output.topic ('out'): they would land "
            "in the protected stream",
        ),
        (
            "input: {topic: in}\noutput: {topic: out, dlq_topic: in}\n" + BASE,
            "output.dlq_topic names the same topic as input.topic ('in'): its records would be "
            "read back as input",
        ),
        (
            "input: {topic: same}\noutput: {topic: same}\n" + BASE,
            "output.topic names the same topic as input.topic ('same')",
        ),
        (
            "output: {topic: out, meta_topic: out}\n" + BASE,
            "output.meta_topic names the same topic as output.topic",
        ),
        (
            "input: {topic: in}\noutput: {meta_topic: in.dlq}\n" + BASE,
            "output.meta_topic names the same topic as output.dlq_topic ('in.dlq')",
        ),
        # infinite γ: the identity, or any used row with a zero, refused like retention 1
        (
            MATRIX.replace(
                "[[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]]",
                "[[1, 0, 0], [0, 1, 0], [0, 0, 1]]",
            ),
            "rr.matrix row 0 mixes zero and positive entries, so γ (and ε) is infinite",
        ),
        (
            MATRIX.replace("[0.1, 0.1, 0.8]]", "[0.1, 0.0, 0.8]]").replace(
                "[0.1, 0.8, 0.1]", "[0.1, 0.9, 0.1]"
            ),
            "rr.matrix row 2 mixes zero and positive entries",
        ),
        # strict scalars: a quoted number is a string, not a number
        (BASE.replace("k: 3", "k: '5'"), "microaggregation.k: must be a whole number"),
        (BASE.replace("k: 3", "k: 5.0"), "microaggregation.k: must be a whole number"),
        (BASE.replace("retention: 0.5", "retention: '0.5'"), "rr.retention: must be a number"),
        (
            BASE.replace("k: 3", "k: 3, standardize: 'yes'"),
            "microaggregation.standardize: must be true or false",
        ),
        (
            BASE.replace("method: microaggregation}", "method: microaggregation, range: ['0', 9]}"),
            "range[0]: must be a number",
        ),
        (BASE.replace("k: 3", "k: 10000001"), "k must be ≤ 1_000_000"),
        (
            BASE.replace("k: 3", "k: 1000000000000000000000000000000"),
            "microaggregation.k: a 31-digit number is too large for this setting",
        ),
        (
            "window: {max_records: 1000000000000000000000000000000}\n" + BASE,
            "window.max_records: a 31-digit number is too large",
        ),
        # YAML 1.1's numbers are text under the core schema: base 60, octal, hex, underscores
        *(
            (BASE.replace("k: 3", f"k: {k}"), "(e.g. 5; 1:30, 010, 0x10 and 1_0 are text)")
            for k in ("1:30", "010", "0x10", "1_0", "0o10")
        ),
        ("window: {max_hold_seconds: 1:00}\n" + BASE, "window.max_hold_seconds: must be a number"),
        ("window: {max_seconds: 1e3.5}\n" + BASE, "window.max_seconds: must be a number"),
        (
            BASE.replace("k: 3", "k: 3, l_diversity: {attribute: occ, l: 4}"),
            "l_diversity.l is 4, but 'occ' has 3 categories: no group can hold 4 distinct",
        ),
        # a topic name Kafka refuses (or a development broker takes, and nobody writes to)
        *(
            (f"{section}: {{{key}: {name}}}\n" + BASE, f"{section}.{key}: must be 1 to 249")
            for section, key, name in (
                ("input", "topic", "'a b/c'"),
                ("input", "topic", "''"),
                ("output", "topic", "'..'"),
                ("output", "dlq_topic", "x" * 250),
                ("output", "meta_topic", "'caf\u00e9'"),
            )
        ),
        # names reach terminals and logs: a control character in one is refused, shown escaped
        (
            BASE.replace("  age:", '  "a\\x1b[2Jge":'),
            "attributes.'a\\x1b[2Jge': must be a non-empty name without control characters",
        ),
        (BASE.replace("  age:", '  "":'), "attributes.'': must be a non-empty name"),
        ('input: {respondent_id: "r\\nid"}\n' + BASE, "input.respondent_id: must be"),
        ('name: "a\\tb"\n' + BASE, "name: must be a non-empty name"),
    ],
)
def test_unsafe_or_loosely_typed_policies_are_refused(text: str, expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        policy_from_yaml(text)
    assert expected in str(err.value), str(err.value)


def test_yaml_numbers_keep_working_and_an_int_may_stand_for_a_float() -> None:
    p = policy_from_yaml(BASE.replace("retention: 0.5", "retention: 0.2").replace("k: 3", "k: 7"))
    assert p.microaggregation.k == 7
    assert p.attributes["occ"].rr is not None and p.attributes["occ"].rr.retention == 0.2
    p = policy_from_yaml("risk: {max_dld: 1, interval_pct: 5}\n" + MATRIX)
    assert p.risk.max_dld == 1.0 and isinstance(p.risk.max_dld, float)
    assert p.microaggregation.k == 3 and policy_from_yaml(BASE.replace("k: 3", "k: 1000000"))
    assert policy_from_yaml("window: {max_seconds: 1e3}\n" + BASE).window.max_seconds == 1000.0


def test_yaml_reads_categories_as_written_and_lets_a_merge_override() -> None:
    """Under YAML 1.1 the categories NO (Norway) and yes were booleans; under the core schema
    they are the text written. A mapping merged in (<<: *anchor) gives defaults that keys
    written beside it override: not a key given twice."""
    p = policy_from_yaml(BASE.replace("categories: [a, b, c]", "categories: [NO, SE, yes]"))
    assert p.attributes["occ"].categories == ["NO", "SE", "yes"]
    anchored = BASE.replace("  age: {", "  age: &num {")
    p = policy_from_yaml(
        anchored + "  hours: {<<: *num, method: microaggregation, range: [0, 99]}\n"
    )
    assert p.attributes["hours"].method is p.attributes["age"].method
    assert p.attributes["hours"].range == (0.0, 99.0)


# -- the k claim covers every quasi-identifier, or says which it leaves out -------------------
CAT_QI = "  sex: {role: quasi_identifier, type: categorical, method: keep, categories: [F, M]}\n"


@pytest.mark.parametrize(
    "extra,expected",
    [
        (CAT_QI, "a quasi-identifier with method keep is published without k-anonymity"),
        (
            "  hours: {role: quasi_identifier, type: numeric, method: noise, "
            "noise: {ratio: 0.1}}\n",
            "set unprotected: true to leave it out of the k claim",
        ),
        (
            "  city: {role: quasi_identifier, type: categorical, method: microaggregation}\n",
            "a categorical quasi_identifier needs 'categories'",
        ),
        (
            "  pay: {role: sensitive, type: numeric, method: top_bottom_code, coding: {top: 9}}\n",
            "coding alone publishes every value inside [bottom, top] unchanged",
        ),
        (
            "  pay: {role: sensitive, type: numeric, method: keep}\n",
            "does not apply to a numeric sensitive",
        ),
        (
            "  at: {role: other, type: timestamp, method: keep}\n",
            "a timestamp is never published verbatim",
        ),
        (
            "  at: {role: quasi_identifier, type: timestamp, method: coarsen}\n",
            "a timestamp attribute cannot have role quasi_identifier",
        ),
        (
            "  age2: {role: other, type: numeric, method: keep, unprotected: true}\n",
            "unprotected: true only applies to a quasi-identifier",
        ),
        (
            "  lvl: {role: quasi_identifier, type: categorical, method: microaggregation, "
            "ordered: true, missing: category, categories: [lo, hi]}\n",
            "an ordered attribute cannot have missing: category",
        ),
        ("  pay: {role: sensitive, type: numeric, method: noise, noise: {}}\n", "noise needs"),
    ],
)
def test_claims_that_would_not_hold_are_refused(extra: str, expected: str) -> None:
    with pytest.raises(PolicyError) as err:
        policy_from_yaml(BASE + extra)
    assert expected in str(err.value), str(err.value)


def test_an_unprotected_quasi_identifier_is_named_outside_the_claim() -> None:
    text = BASE + CAT_QI.replace("method: keep,", "method: keep, unprotected: true,")
    p = policy_from_yaml(text)
    assert p.k_claim == ["age"]
    assert p.unprotected_quasi_identifiers == ["sex"]


def test_ranking_is_refused_for_a_tuple_of_quasi_identifiers() -> None:
    text = BASE.replace("{k: 3}", "{k: 3, algorithm: ranking}")
    assert policy_from_yaml(text).k_claim == ["age"]  # one numeric attribute: allowed
    two = text + "  h: {role: quasi_identifier, type: numeric, method: microaggregation}\n"
    with pytest.raises(PolicyError, match="no k-anonymity on the tuple"):
        policy_from_yaml(two)


def test_noise_may_follow_coding_on_a_sensitive_number() -> None:
    p = policy_from_yaml(
        BASE + "  pay: {role: sensitive, type: numeric, method: noise, "
        "coding: {top: 100, bottom: 0}, noise: {sd: 5}}\n"
    )
    assert p.attributes["pay"].coding is not None and p.attributes["pay"].noise is not None


# -- republication: the mode, what a release is, edit rules ------------------------------------
PANEL = (
    BASE
    + """\
  sex: {role: quasi_identifier, type: categorical, method: microaggregation, categories: [F, M]}
  rel: {role: quasi_identifier, type: categorical, method: microaggregation,
        categories: [husband, wife, other]}
  wave: {role: other, type: numeric, method: keep}
"""
)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "republication: {mode: fresh}\n",
            "republication.mode: Input should be 'regroup', 'cohort', 'deferred' or 'panel'",
        ),
        (
            "republication: {wave_attribute: wav}\n",
            "republication.wave_attribute 'wav' is not an attribute (did you mean 'wave'?)",
        ),
        (
            "republication: {wave_attribute: sex}\n",
            "republication.wave_attribute 'sex' must be a numeric attribute of role other",
        ),
        ("republication: {slack: -1}\n", "republication.slack must be between 0 and"),
        (
            "republication: {pool: wave}\n",
            "republication.pool: Input should be 'window' or 'release'",
        ),
        (
            "microaggregation: {k: 3, edit_rules: [{rel: [husband], age: [F]}]}\n",
            "edit_rules[0] names 'age', which is not a nominal quasi-identifier of the k claim",
        ),
        (
            "microaggregation: {k: 3, edit_rules: [{rel: [husbnd], sex: [F]}]}\n",
            "edit_rules[0].rel must list categories it can publish (husband, other, wife); 1 "
            "unknown",
        ),
        ("microaggregation: {k: 3, edit_rules: [{}]}\n", "edit_rules[0] names no attribute"),
        (
            "republication: {wave_attribute: wave}\nREPLACE wave: range: [-5, -1]\n",
            "attributes.wave.range holds no wave number: a wave is a whole number in "
            "[0, 2147483647]",
        ),
        (
            "microaggregation: {k: 3, edit_rules: [{sex: [M, F]}]}\n",
            "edit_rules forbid every combination of sex: no group could publish them",
        ),
        (
            "microaggregation: {k: 3, edit_rules: [{sex: [F]}, {rel: [wife, husband, other]}]}\n",
            "edit_rules forbid every combination of sex, rel: no group could publish them",
        ),
        ("risk: {max_linked_below_k: 2}\n", "risk.max_linked_below_k must be a probability"),
    ],
)
def test_bad_republication_settings_are_named(extra: str, expected: str) -> None:
    text = PANEL.replace("microaggregation: {k: 3}\n", "") if "microaggregation" in extra else PANEL
    if "REPLACE wave: " in extra:  # a setting of the wave attribute itself
        extra, setting = extra.split("REPLACE wave: ")
        text = text.replace("method: keep}", f"method: keep, {setting.strip()}}}")
    with pytest.raises(PolicyError) as err:
        policy_from_yaml(extra + text)
    assert expected in str(err.value), str(err.value)


def test_edit_rules_that_leave_one_combination_are_accepted() -> None:
    """The check is on the grid: only the combination (M, other) is left."""
    rules = "[{sex: [F]}, {sex: [M], rel: [husband, wife]}]"
    policy = policy_from_yaml(
        f"microaggregation: {{k: 3, edit_rules: {rules}}}\n"
        + PANEL.replace("microaggregation: {k: 3}\n", "")
    )
    assert len(policy.microaggregation.edit_rules) == 2


def test_republication_defaults_and_the_shipped_panel_policy() -> None:
    rep = policy_from_yaml(PANEL).republication
    assert (rep.mode.value, rep.wave_attribute, rep.pool.value, rep.slack) == (
        "regroup",
        None,
        "window",
        0,
    )
    adult = load_policy(ADULT)
    assert adult.republication.wave_attribute == "wave"
    assert adult.republication.pool.value == "release"
    assert adult.microaggregation.edit_rules  # Husband with Female and the like never published
    # the bundled copy `privgw demo` uses is the same policy
    assert (ROOT / "stream_jobs" / "data" / "adult.yaml").read_text() == ADULT.read_text()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("max_seconds: 2", "window.max_seconds"),
        ("max_hold_seconds: 30", "window.max_hold_seconds"),
        ("max_wave_seconds: 604800", "republication.max_wave_seconds"),
        ("top: 20000", "attributes.capital_gain.coding.top"),
        ("retention: 0.75", "attributes.income.rr.retention"),
    ],
)
@pytest.mark.parametrize("bad", [".inf", "-.inf", ".nan"])
def test_no_policy_number_takes_inf_or_nan(setting: str, value: str, bad: str) -> None:
    """A window closing after .inf seconds overflowed the worker's poll timeout."""
    text = ADULT.read_text()
    assert setting in text
    key = setting.partition(":")[0]
    with pytest.raises(PolicyError) as err:
        policy_from_yaml(text.replace(setting, f"{key}: {bad}"))
    assert f"{value}: must be a finite number" in str(err.value), str(err.value)


def test_a_policy_nested_too_deeply_is_a_policy_error_not_a_crash() -> None:
    """PyYAML composes recursively: 2 KB nested a thousand deep was an internal error."""
    with pytest.raises(PolicyError, match="nested too deeply"):
        policy_from_yaml("a: " + "[" * 1000 + "]" * 1000)


def test_max_wave_step_is_at_least_one_and_unset_keeps_the_version() -> None:
    text = (ROOT / "deploy" / "policies" / "adult.yaml").read_text()
    base = policy_from_yaml(text)
    assert base.republication.wave_step == 10
    with pytest.raises(PolicyError, match="max_wave_step must be >= 1, got 0"):
        policy_from_yaml(
            text.replace("retire_after_waves: 3,", "retire_after_waves: 3, max_wave_step: 0,")
        )
    stepped = policy_from_yaml(
        text.replace("retire_after_waves: 3,", "retire_after_waves: 3, max_wave_step: 2,")
    )
    assert stepped.republication.wave_step == 2 and stepped.version != base.version
