"""A state directory for the file workflow: `privgw protect --state-dir` publishes a panel
file's waves as successive releases, on the same state a later file continues.

The sqlite backend in one file (``state.db``), checked as `privgw run` checks it before it
writes: the directory's condition, its backend and shard count, and the policy it records (a
changed policy is refused, naming `privgw policy diff`). The secret's fingerprint is checked by
the caller, on the store this returns (``gateway.state_store.state_api.check_key_fingerprint``).
Loaded through the ``privgw.stores`` entry point, so that the file workflow never imports
this package.
"""

from __future__ import annotations

from pathlib import Path

from gateway.errors import PrivgwError
from gateway.policy import Policy
from state.failures import check_state_dir
from state.layout import SINGLE, Backend, resolve_backend, resolve_shards
from state.policy_record import check_policy
from state.sqlite_store import SQLiteStore


def open_file_state(state_dir: Path, policy: Policy, accept: str | None = None) -> SQLiteStore:
    """The store of ``state_dir`` for ``policy``, its policy recorded (new), found the same, or
    migrated to it when ``accept`` names its version (`protect --policy-upgrade`); nothing is
    written before every check has passed."""
    state_dir = Path(state_dir)
    check_state_dir(state_dir, create=False)
    if resolve_backend(state_dir, None) is not Backend.SQLITE:
        raise PrivgwError(
            f"--state-dir {state_dir} holds the partitioned backend's state (a stream's, "
            "rebuilt from its changelog): a file is protected on a sqlite state; give another "
            "--state-dir"
        )
    if resolve_shards(state_dir, None) != 1:
        raise PrivgwError(
            f"--state-dir {state_dir} holds the state of several engine shards (a stream "
            "worker's): a file is protected on a state of one; give another --state-dir"
        )
    check_policy(state_dir, Backend.SQLITE.value, 1, policy, accept=accept, dry_run=True)
    check_state_dir(state_dir)  # created if new
    check_policy(state_dir, Backend.SQLITE.value, 1, policy, accept=accept)
    return SQLiteStore(state_dir / SINGLE)
