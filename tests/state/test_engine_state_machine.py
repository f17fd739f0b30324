"""A hypothesis state machine over the engine and a state store: publish, republish, change,
crash and replay, poison. Invariants over the whole history: every centroid is shared by at
least k respondents, an unchanged true value is always randomized the same, replayed records
are byte-identical, and every record sent is published, dead-lettered or still held. Each
republication mode runs the machine; ``regroup`` and ``cohort`` also keep k in every release
(here every window is one), ``cohort`` every respondent's linked candidate set ≥ k."""

from __future__ import annotations

from collections import defaultdict

import orjson
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gateway.engine.engine import Engine
from gateway.engine.records import SourceRef, ValidRecord
from gateway.keyed.keyed import Keyring
from gateway.policy import policy_from_yaml
from gateway.state_store.live_counts import audit_live_counts
from gateway.validation import Rejection, Validator
from state.memory_store import MemoryStore

POLICY_TEXT = """
input: {respondent_id: rid}
window: {max_records: 1000, max_seconds: 1, max_hold_seconds: 5, on_hold_timeout: suppress}
microaggregation: {k: 3}
attributes:
  age:   {role: quasi_identifier, type: numeric, method: microaggregation, range: [0, 130]}
  hours: {role: quasi_identifier, type: numeric, method: microaggregation, range: [0, 168]}
  occ:
    role: sensitive
    type: categorical
    method: randomized_response
    categories: [a, b, c, d]
    rr: {mode: uniform, retention: 0.6}
"""
POLICY = policy_from_yaml(POLICY_TEXT + "republication: {mode: deferred}\n")
K = POLICY.microaggregation.k
KEY = Keyring(b"state-machine-secret-0123456789")
VALIDATOR = Validator(POLICY)


class GatewayMachine(RuleBasedStateMachine):
    policy = POLICY

    def __init__(self) -> None:
        super().__init__()
        self.store = MemoryStore()
        self.engine = Engine(self.policy, keyring=KEY, store=self.store)
        self.truth: dict[str, dict[str, object]] = {}
        self.pending: list[ValidRecord] = []  # consumed, not yet handed to a window
        self.held: list[ValidRecord] = []
        self.offset = 0
        self.now = 0.0
        self.sent: set[str] = set()
        self.dead: set[str] = set()
        self.first_copy: dict[str, bytes] = {}
        self.rr_seen: dict[tuple[str, object], object] = {}
        self.members: dict[tuple[object, object], set[str]] = defaultdict(set)
        self.owner: dict[str, str] = {}
        self.truth_log: dict[str, bytes] = {}  # record id -> the true values it carried
        self.ages: dict[str, list[int]] = defaultdict(list)  # every age a respondent had
        self.release_classes: list[int] = []  # distinct respondents per tuple per window
        # respondent -> per window it published a tuple in: the respondents sharing it there
        self.classes_of: dict[str, list[frozenset[str]]] = defaultdict(list)

    def _send(self, rid: str) -> None:
        raw = orjson.dumps({"rid": rid, **self.truth[rid]})
        res = VALIDATOR.decode_and_validate(raw, rid.encode())
        assert not isinstance(res, Rejection)
        source = SourceRef("in", 0, self.offset)
        self.offset += 1
        self.sent.add(source.record_id)
        self.owner[source.record_id] = rid
        self.truth_log[source.record_id] = raw
        self.pending.append(ValidRecord(res[0], res[1], source, self.now))

    @rule(n=st.integers(1, 6), age=st.integers(18, 80), hours=st.integers(1, 60))
    def new_respondents(self, n: int, age: int, hours: int) -> None:
        for j in range(n):
            rid = f"r{len(self.truth)}"
            self.truth[rid] = {"age": age + j, "hours": hours, "occ": "abcd"[j % 4]}
            self._send(rid)

    @precondition(lambda self: bool(self.truth))
    @rule(data=st.data())
    def republish_unchanged(self, data: st.DataObject) -> None:
        for rid in data.draw(st.lists(st.sampled_from(sorted(self.truth)), max_size=8)):
            self._send(rid)

    @precondition(lambda self: bool(self.truth))
    @rule(data=st.data(), attr=st.sampled_from(["age", "occ"]))
    def change_value(self, data: st.DataObject, attr: str) -> None:
        rid = data.draw(st.sampled_from(sorted(self.truth)))
        if attr == "age":
            self.ages[rid].append(int(self.truth[rid]["age"]))  # type: ignore[call-overload]
            self.truth[rid]["age"] = data.draw(st.integers(18, 80))
        else:
            self.truth[rid]["occ"] = data.draw(st.sampled_from("abcd"))
        self._send(rid)

    @precondition(lambda self: bool(self.ages))
    @rule(data=st.data())
    def revert_age(self, data: st.DataObject) -> None:
        """Back to an earlier age: the respondent rejoins the group it had for it."""
        rid = data.draw(st.sampled_from(sorted(self.ages)))
        self.truth[rid]["age"] = data.draw(st.sampled_from(self.ages[rid]))
        self._send(rid)

    @rule(raw=st.sampled_from([b"{", b"", b'{"rid": "x", "age": "old"}', b"[1]"]))
    def poison(self, raw: bytes) -> None:
        res = VALIDATOR.decode_and_validate(raw, b"x")
        assert isinstance(res, Rejection)
        record_id = f"in/0/{self.offset}"
        self.offset += 1
        self.sent.add(record_id)
        self.dead.add(record_id)

    @rule(dt=st.floats(0.0, 3.0))
    def flush(self, dt: float) -> None:
        self.now += dt
        result = self.engine.protect_window([*self.held, *self.pending], now=self.now)
        self.pending = []
        self.held = list(result.held)
        release: dict[tuple[object, object], set[str]] = defaultdict(set)
        for rec in result.published:
            prev = self.first_copy.setdefault(rec.record_id, rec.value)
            assert prev == rec.value, "a replayed record differs from its first copy"
            row = orjson.loads(rec.value)
            rid = self.owner[rec.record_id]
            true = orjson.loads(self._true_at(rec.record_id))
            key = (rid, true["occ"])
            assert self.rr_seen.setdefault(key, row["occ"]) == row["occ"]
            if row["age"] is not None:
                self.members[(row["age"], row["hours"])].add(rid)
                release[(row["age"], row["hours"])].add(rid)
        self.release_classes.extend(len(m) for m in release.values())
        for members in release.values():
            for rid in members:
                self.classes_of[rid].append(frozenset(members))

    def _true_at(self, record_id: str) -> bytes:
        return self.truth_log[record_id]

    @rule()
    def crash_and_restart(self) -> None:
        """The worker dies: uncommitted records (held and pending) are consumed again by a new
        engine on the same durable store."""
        self.engine = Engine(self.policy, keyring=KEY, store=self.store)
        self.pending = [*self.held, *self.pending]
        self.held = []

    @invariant()
    def groups_have_k_respondents(self) -> None:
        assert all(len(m) >= K for m in self.members.values())

    @invariant()
    def live_counts_match_the_members(self) -> None:
        """Each group's stored live count is the number of respondents it is current for."""
        audit = audit_live_counts(self.store.items())
        assert audit.consistent, f"{len(audit.drifted)} groups with drifted live counts"

    @invariant()
    def every_record_is_accounted_for(self) -> None:
        published = set(self.first_copy)
        waiting = {r.source.record_id for r in [*self.held, *self.pending] if r.source}
        assert not published & self.dead
        assert published | self.dead | waiting == self.sent

    def linked(self, rid: str) -> frozenset[str]:
        """What an intruder following ``rid`` over the windows gets: the respondents sharing
        its published tuple in every window it published one in."""
        sets = self.classes_of[rid]
        return frozenset.intersection(*sets) if sets else frozenset()


class RegroupMachine(GatewayMachine):
    policy = policy_from_yaml(POLICY_TEXT + "republication: {mode: regroup}\n")

    @invariant()
    def every_release_has_k_per_tuple(self) -> None:
        assert all(n >= K for n in self.release_classes)


class CohortMachine(RegroupMachine):
    policy = policy_from_yaml(POLICY_TEXT + "republication: {mode: cohort, slack: 1}\n")

    @invariant()
    def linked_sets_stay_k(self) -> None:
        small = [rid for rid in self.classes_of if len(self.linked(rid)) < K]
        assert not small, f"{len(small)} respondents linked to fewer than k"


for machine in (GatewayMachine, RegroupMachine, CohortMachine):
    machine.TestCase.settings = settings(max_examples=300, stateful_step_count=30, deadline=None)
test_gateway_state_machine = GatewayMachine.TestCase
test_regroup_state_machine = RegroupMachine.TestCase
test_cohort_state_machine = CohortMachine.TestCase
