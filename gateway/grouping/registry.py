"""A group's registry entry under the ``regroup`` and ``cohort`` republication modes.

A group is formed once, from at least k distinct respondents; member ``j`` is bit ``j`` of the
masks below. Per release the entry keeps ``published``, the mask of members that published the
group's tuple in the group's current release, and per member ``linked[j]``, the mask of members
that published the same tuple as ``j`` in *every* earlier release ``j`` published in. What an
intruder who follows member ``j`` across releases can narrow it down to — its linked candidate
set within the group — is therefore ``linked[j] & published`` once ``j`` has published in the
current release (:meth:`Group.linked_mask`); a respondent that moved between groups carries the
part from its earlier groups as a set of member digests (:func:`linked_size`).

Stored as a MessagePack map with short keys (one such entry is written per group and release):
``live`` members now, ``size`` at formation, ``t`` the published tuple, ``m`` the members' keyed
digests (16 bytes, never an id), ``r`` the current release, ``P`` its mask, ``l`` the linked
masks, ``tr`` the release whose first publishers set ``t`` (cohorts recompute it); with
``microaggregation.strata``, ``s`` the keyed digest of the group's stratum; with
``microaggregation.l_diversity``, ``v`` the distinct published sensitive values (8-byte keyed
digests) of the current release's publishers; once ``t`` was recomputed, ``h`` the tuples it
replaced, newest first, each with the release that set it (a replay of a record decided before
a crash publishes the tuple of its time: :mod:`gateway.grouping.replay`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MEMBER_DIGEST_BYTES = 16
TUPLES_KEPT = 3  # earlier tuples a group keeps for replays (as many as a respondent's records)


def member_digest(key: bytes) -> bytes:
    """The digest a group keeps of a member: the tail of its respondent key (a keyed HMAC;
    partition-scoped keys carry the partition in front)."""
    return key[-MEMBER_DIGEST_BYTES:]


def newer(release: str, than: str) -> bool:
    """Whether ``release`` comes after ``than``: waves by number, a window release is after
    any other (its id is fresh per window)."""
    if release == than:
        return False
    if is_wave(release) and is_wave(than):
        return int(release) > int(than)
    return True


def is_wave(release: str) -> bool:
    """Whether a release key is a wave number (else a window's id)."""
    return release.lstrip("-").isdigit()


@dataclass(slots=True)
class Group:
    """A group's registry entry, decoded (see the module docstring)."""

    live: int
    size: int
    tuple_: list[Any]
    members: list[bytes]
    release: str
    published: int
    linked: list[int]
    tuple_release: str
    changed: bool = False  # written back at the end of the window
    stratum: str | None = None  # the stratum every member is in (None: the policy has none)
    values: set[bytes] = field(default_factory=set)  # l-diversity: see the module docstring
    history: list[list[Any]] = field(default_factory=list)  # [[tuple_release, tuple], ...]

    @classmethod
    def formed(
        cls,
        tuple_: Sequence[Any],
        members: Sequence[bytes],
        release: str,
        *,
        stratum: str | None = None,
        values: Iterable[bytes] = (),
    ) -> Group:
        """A new group, every member publishing its tuple in ``release``."""
        m = len(members)
        full = (1 << m) - 1
        return cls(
            live=m,
            size=m,
            tuple_=list(tuple_),
            members=list(members),
            release=release,
            published=full,
            linked=[full] * m,
            tuple_release=release,
            changed=True,
            stratum=stratum,
            values=set(values),
        )

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Group | None:
        """The entry, or None for a registry entry of the ``deferred`` mode (no tuple)."""
        if "t" not in doc:
            return None
        return cls(
            live=int(doc["live"]),
            size=int(doc["size"]),
            tuple_=list(doc["t"]),
            members=list(doc["m"]),
            release=str(doc["r"]),
            published=int(doc["P"]),
            linked=[int(v) for v in doc["l"]],
            tuple_release=str(doc["tr"]),
            stratum=None if doc.get("s") is None else str(doc["s"]),
            values=set(doc.get("v", ())),
            history=[list(entry) for entry in doc.get("h", ())],
        )

    def to_doc(self) -> dict[str, Any]:
        doc = {
            "live": self.live,
            "size": self.size,
            "t": self.tuple_,
            "m": self.members,
            "r": self.release,
            "P": self.published,
            "l": self.linked,
            "tr": self.tuple_release,
        }
        if self.stratum is not None:
            doc["s"] = self.stratum
        if self.values:
            doc["v"] = sorted(self.values)
        if self.history:
            doc["h"] = self.history
        return doc

    # -- its tuple --------------------------------------------------------------------------
    def retune(self, release: str) -> None:
        """``release``'s first publishers set the tuple anew (the caller assigns it): the one
        before is kept, with the release that set it, for replays."""
        self.history = [[self.tuple_release, self.tuple_], *self.history][:TUPLES_KEPT]
        self.tuple_release = release

    def tuple_at(self, tuple_release: str) -> list[Any] | None:
        """The tuple that ``tuple_release`` set, if the group still knows it."""
        if tuple_release == self.tuple_release:
            return self.tuple_
        for release, tuple_ in self.history:
            if release == tuple_release:
                return list(tuple_)
        return None

    # -- releases ---------------------------------------------------------------------------
    def enter(self, release: str) -> bool:
        """Make ``release`` the group's current one; False when it is older (a straggler of a
        release the group has left behind: it can no longer join that release's class)."""
        if release == self.release:
            return True
        if not newer(release, self.release):
            return False
        full = (1 << len(self.members)) - 1
        published = self.published
        if published != full:  # fold the release: each of its publishers' linked set shrinks
            linked = self.linked
            for j in range(len(linked)):
                if published >> j & 1:
                    linked[j] &= published
        self.release = release
        self.published = 0
        self.values = set()  # the new release's publishers bring their own
        self.changed = True
        return True

    def publishers(self) -> int:
        """How many members published the tuple in the current release."""
        return self.published.bit_count()

    def publish(self, bits: int) -> None:
        if bits & ~self.published:
            self.published |= bits
            self.changed = True

    # -- linked candidate sets --------------------------------------------------------------
    def linked_mask(self, j: int, extra: int = 0) -> int:
        """Member ``j``'s linked candidates within the group, counting the current release if
        ``j`` published in it (``extra``: members about to publish in it too)."""
        published = self.published | extra
        if published >> j & 1:
            return self.linked[j] & published
        return self.linked[j]

    def digests(self, mask: int) -> set[bytes]:
        return {d for j, d in enumerate(self.members) if mask >> j & 1}


def linked_size(group: Group, j: int, carried: Sequence[bytes] | None) -> int:
    """The size of member ``j``'s linked candidate set: within its group, intersected with
    ``carried`` (the other respondents it was linked with in earlier groups; None: none)."""
    mask = group.linked_mask(j)
    if carried is None:
        return mask.bit_count()
    if not carried:  # linked to itself alone: intersections cannot grow it back
        return 1
    others = set(carried)
    members = group.members
    return 1 + sum(
        1 for i in range(len(members)) if i != j and mask >> i & 1 and members[i] in others
    )


def carried_after_leaving(group: Group, j: int, carried: Sequence[bytes] | None) -> list[bytes]:
    """What a member leaving ``group`` carries on: the other respondents still in its linked
    set (an intruder who follows it intersects its next group with this)."""
    own = group.members[j]
    here = group.digests(group.linked_mask(j)) - {own}
    if carried is not None:
        here &= set(carried)
    return sorted(here)


def linked_fixpoint(grp: Group, batch: list[int], bit: Mapping[int, int], k: int) -> list[int]:
    """The largest part of ``batch`` whose members all keep a linked set of ≥ k when they
    publish together now (dropping one can only shrink the others' sets, so repeat)."""
    while batch:
        extra = 0
        for i in batch:
            extra |= bit[i]
        keep = [
            i for i in batch if grp.linked_mask(bit[i].bit_length() - 1, extra).bit_count() >= k
        ]
        if len(keep) == len(batch):
            return batch
        batch = keep
    return batch
