"""`privgw secret create FILE`, run as an operator runs it: a new 0600 secret, its key
fingerprint printed (never the secret), an existing file never overwritten."""

from __future__ import annotations

import functools
import re
import stat
from pathlib import Path

import clikit

from gateway.keyed.keyed import SECRET_FILE_ENV, Keyring, load_secret

ROOT = Path(__file__).resolve().parents[2]


privgw = functools.partial(clikit.privgw, umask=0o022)  # the usual umask unless a test sets one


def test_secret_create_writes_a_private_secret_and_prints_its_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "privgw.key"
    path.parent.mkdir()
    proc = privgw("secret", "create", path, umask=0)  # 0600 whatever the umask
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = load_secret({SECRET_FILE_ENV: str(path)})
    assert len(bytes.fromhex(secret.decode())) == 32
    printed = re.findall(r"key fingerprint ([0-9a-f]{16})\b", proc.stdout)
    assert printed == [Keyring(secret).fingerprint()], proc.stdout
    assert secret.decode() not in proc.stdout + proc.stderr

    other = tmp_path / "other.key"
    assert privgw("secret", "create", other).returncode == 0
    assert other.read_bytes() != path.read_bytes()  # random, not derived from anything


def test_secret_create_refuses_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "privgw.key"
    assert privgw("secret", "create", path).returncode == 0
    before = path.read_bytes()
    proc = privgw("secret", "create", path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("privgw: error:") and "already exists" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert path.read_bytes() == before


def test_secret_create_makes_no_directory(tmp_path: Path) -> None:
    """A missing directory (or a file where it should be) is one line, exit 2, and nothing is
    created: a mistyped path would leave the secret where nobody looks (issue 30)."""
    missing = tmp_path / "nonexistent" / "dir" / "x.key"
    proc = privgw("secret", "create", missing)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("privgw: error:") and "does not exist" in proc.stderr
    assert str(missing.parent) in proc.stderr
    assert not (tmp_path / "nonexistent").exists()
    (tmp_path / "file").write_text("")
    proc = privgw("secret", "create", tmp_path / "file" / "x.key")
    assert proc.returncode == 2 and "is not a directory" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


def test_secret_create_names_an_empty_path_or_a_directory(tmp_path: Path) -> None:
    # '' was taken for "." and refused as ". already exists"
    proc = privgw("secret", "create", "")
    assert proc.returncode == 2 and "file name is empty" in proc.stderr, proc.stderr
    proc = privgw("secret", "create", tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert f"{tmp_path} is a directory" in proc.stderr and "already exists" not in proc.stderr
    assert list(tmp_path.iterdir()) == []
