from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import pickle
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from gateway.errors import PrivgwError
from gateway.keyed.keyed import (
    SECRET_ENV,
    SECRET_FILE_ENV,
    KeyedSource,
    Keyring,
    SecretError,
    generate_secret_file,
    load_secret,
)
from gateway.keyed.randomness import UniformSource

SECRET = b"test-secret-0123456789abcdef"
OTHER = b"another-secret-0123456789abcdef"


def _hmac(secret: bytes, msg: bytes) -> bytes:
    return hmac.new(secret, msg, hashlib.sha256).digest()


@pytest.fixture
def ring() -> Keyring:
    return Keyring(SECRET)


# --- digests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", [SECRET, b"k" * 64, b"long" * 40])
def test_respondent_key_is_hmac_sha256(secret: bytes) -> None:
    ring = Keyring(secret)
    key = ring.respondent_key("R-42")
    assert key == _hmac(secret, b"privgw/v1/respondent\x00R-42")
    assert len(key) == 32


@given(st.lists(st.text(), max_size=20))
def test_vectorised_forms_match_scalar_forms(ids: list[str]) -> None:
    ring = Keyring(SECRET)
    assert ring.respondent_keys(ids) == [ring.respondent_key(i) for i in ids]
    assert ring.value_digests("job", ids) == [ring.value_digest("job", v) for v in ids]
    assert ring.pseudonyms(ids) == [ring.pseudonym(i) for i in ids]


def test_digests_are_deterministic_across_instances() -> None:
    a, b = Keyring(SECRET), Keyring(bytearray(SECRET))
    assert a.respondent_key("x") == b.respondent_key("x")
    assert a.value_digest("sex", "F") == b.value_digest("sex", "F")
    assert a.pseudonym("x") == b.pseudonym("x")
    assert a.fingerprint() == b.fingerprint()


def test_different_secret_gives_different_digests(ring: Keyring) -> None:
    other = Keyring(OTHER)
    assert ring.respondent_key("x") != other.respondent_key("x")
    assert ring.value_digest("sex", "F") != other.value_digest("sex", "F")
    assert ring.pseudonym("x") != other.pseudonym("x")
    assert ring.fingerprint() != other.fingerprint()


def test_domain_separation_between_digest_kinds(ring: Keyring) -> None:
    s = "same-string"
    rk = ring.respondent_key(s)
    vd = ring.value_digest("", s)
    ps = ring.pseudonym(s)
    assert len(vd) == 16
    assert rk[:16] != vd
    assert ps != rk.hex()
    assert len(ps) == 64
    assert bytes.fromhex(ps) != rk


def test_value_digest_separates_attribute_and_value(ring: Keyring) -> None:
    assert ring.value_digest("ab", "c") != ring.value_digest("a", "bc")
    assert ring.value_digest("sex", "F") != ring.value_digest("gender", "F")
    assert ring.value_digest("sex", "F") != ring.value_digest("sex", "M")


def test_non_str_ids_are_rejected(ring: Keyring) -> None:
    with pytest.raises(TypeError):
        ring.respondent_keys([b"bytes-id"])  # type: ignore[list-item]


# --- secret hygiene --------------------------------------------------------------------------


def test_repr_and_str_never_show_the_secret(ring: Keyring) -> None:
    for text in (repr(ring), str(ring), repr(KeyedSource(ring)), f"{ring}"):
        assert SECRET.decode() not in text
        assert SECRET.hex() not in text
        assert base64.b64encode(SECRET).decode() not in text
        assert "fingerprint" in text or "Keyring" in text


def test_keyring_cannot_be_pickled(ring: Keyring) -> None:
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(ring)


@pytest.mark.parametrize("secret", [b"", b"q7#Zk", b"x" * 15])
def test_short_secret_is_refused_with_a_clear_error(secret: bytes) -> None:
    with pytest.raises(SecretError, match=SECRET_ENV) as info:
        Keyring(secret)
    assert isinstance(info.value, PrivgwError)
    if secret:
        assert secret.decode() not in str(info.value)


def test_non_bytes_secret_is_refused() -> None:
    with pytest.raises(TypeError):
        Keyring("a-text-secret-of-enough-length")  # type: ignore[arg-type]


# --- keyed uniforms --------------------------------------------------------------------------


def _draw_keys(ring: Keyring, n: int) -> list[bytes]:
    rks = ring.respondent_keys([f"R{i}" for i in range(n)])
    vd = ring.value_digest("occupation", "nurse")
    return [rk + vd for rk in rks]


def test_keyed_source_is_a_uniform_source(ring: Keyring) -> None:
    src: UniformSource = KeyedSource(ring)
    assert src.uniform("a", 3, [b"1", b"2", b"3"]).shape == (3,)


def test_uniform_matches_the_documented_formula(ring: Keyring) -> None:
    key = ring.respondent_key("R1") + ring.value_digest("occupation", "nurse")
    d = _hmac(SECRET, b"privgw/v1/draw\x00occupation\x00" + key)
    expected = (int.from_bytes(d[:8], "big") >> 11) / 2**53
    got = KeyedSource(ring).uniform("occupation", 1, [key])
    assert got.dtype == np.float64
    assert got[0] == expected


def test_uniform_is_deterministic_across_instances(ring: Keyring) -> None:
    keys = _draw_keys(ring, 1000)
    a = KeyedSource(ring).uniform("occupation", 1000, keys)
    b = KeyedSource(Keyring(SECRET)).uniform("occupation", 1000, keys)
    np.testing.assert_array_equal(a, b)
    # order-independent: each draw depends on its own key only
    c = KeyedSource(ring).uniform("occupation", 1000, keys[::-1])
    np.testing.assert_array_equal(a, c[::-1])


def test_uniform_is_the_same_in_a_fresh_interpreter(ring: Keyring) -> None:
    """A restart (new process, new hash seed) gives the same draws without any state."""
    keys = _draw_keys(ring, 5)
    here = KeyedSource(ring).uniform("occupation", 5, keys)
    code = (
        "import sys\n"
        "from gateway.keyed.keyed import Keyring, KeyedSource\n"
        "keys = [bytes.fromhex(h) for h in sys.argv[2:]]\n"
        "src = KeyedSource(Keyring(bytes.fromhex(sys.argv[1])))\n"
        "u = src.uniform('occupation', len(keys), keys)\n"
        "print(' '.join(repr(float(x)) for x in u))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, SECRET.hex(), *[k.hex() for k in keys]],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "random"},
        cwd=Path(__file__).resolve().parents[2],
    ).stdout.split()
    assert [float(x) for x in out] == here.tolist()


def test_different_secret_gives_different_draws(ring: Keyring) -> None:
    keys = _draw_keys(ring, 100)
    a = KeyedSource(ring).uniform("occupation", 100, keys)
    b = KeyedSource(Keyring(OTHER)).uniform("occupation", 100, keys)
    assert not np.any(a == b)


def test_different_purpose_gives_different_draws(ring: Keyring) -> None:
    keys = _draw_keys(ring, 100)
    src = KeyedSource(ring)
    a = src.uniform("occupation", 100, keys)
    b = src.uniform("income", 100, keys)
    assert not np.any(a == b)
    # the purpose/key boundary is unambiguous for keys of the same length
    assert src.uniform("ab", 1, [b"c" * 4])[0] != src.uniform("a", 1, [b"bccc"])[0]


def test_draws_are_uniform_on_unit_interval(ring: Keyring) -> None:
    n = 200_000
    keys = [i.to_bytes(8, "big") for i in range(n)]
    u = KeyedSource(ring).uniform("ks", n, keys)
    assert u.shape == (n,)
    assert float(u.min()) >= 0.0
    assert float(u.max()) < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    # the two halves are not correlated either (independent keys give independent draws)
    assert abs(float(np.corrcoef(u[: n // 2], u[n // 2 :])[0, 1])) < 0.02


def test_uniform_needs_one_key_per_draw(ring: Keyring) -> None:
    src = KeyedSource(ring)
    with pytest.raises(ValueError, match="needs one key per draw"):
        src.uniform("occupation", 3)
    with pytest.raises(ValueError, match="2 keys for 3 draws"):
        src.uniform("occupation", 3, [b"a", b"b"])
    with pytest.raises(TypeError):
        src.uniform("occupation", 1, ["text"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="NUL"):
        src.uniform("occ\x00upation", 1, [b"a"])
    empty = src.uniform("occupation", 0, [])
    assert empty.shape == (0,)
    assert empty.dtype == np.float64


# --- load_secret / generate_secret_file ------------------------------------------------------


def test_load_secret_from_text() -> None:
    assert load_secret({SECRET_ENV: "correct horse battery staple"}) == (
        b"correct horse battery staple"
    )


def test_load_secret_from_hex_and_base64() -> None:
    raw = bytes(range(32))
    assert load_secret({SECRET_ENV: "hex:" + raw.hex()}) == raw
    assert load_secret({SECRET_ENV: "base64:" + base64.b64encode(raw).decode()}) == raw


@pytest.mark.parametrize("value", ["hex:zz-not-hex-zz-0123456789", "base64:***not base64***"])
def test_load_secret_bad_encoding_does_not_echo_the_value(value: str) -> None:
    with pytest.raises(SecretError, match=SECRET_ENV) as info:
        load_secret({SECRET_ENV: value})
    assert value.split(":", 1)[1] not in str(info.value)


def test_load_secret_from_file_strips_one_trailing_newline(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_bytes(b"file-secret-0123456789\n")
    f.chmod(0o600)
    assert load_secret({SECRET_FILE_ENV: str(f)}) == b"file-secret-0123456789"
    f.write_bytes(b"file-secret-0123456789\r\n")
    assert load_secret({SECRET_FILE_ENV: str(f)}) == b"file-secret-0123456789"
    f.write_bytes(b"\x00\x01binary-secret-0123456789")
    assert load_secret({SECRET_FILE_ENV: str(f)}) == b"\x00\x01binary-secret-0123456789"


def test_load_secret_both_set_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "secret"
    f.write_bytes(b"file-secret-0123456789")
    with pytest.raises(SecretError, match="both"):
        load_secret({SECRET_ENV: "env-secret-0123456789", SECRET_FILE_ENV: str(f)})


@pytest.mark.parametrize("environ", [{}, {SECRET_ENV: ""}, {"OTHER": "x" * 40}])
def test_load_secret_neither_set_says_how_to_set_one(environ: dict[str, str]) -> None:
    with pytest.raises(SecretError) as info:
        load_secret(environ)
    assert SECRET_ENV in str(info.value)
    assert SECRET_FILE_ENV in str(info.value)


def test_load_secret_unreadable_file_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match=SECRET_FILE_ENV):
        load_secret({SECRET_FILE_ENV: str(tmp_path / "missing")})
    with pytest.raises(SecretError, match=SECRET_FILE_ENV):
        load_secret({SECRET_FILE_ENV: str(tmp_path)})  # a directory


def test_a_secret_file_that_is_not_a_regular_file_or_too_large_is_refused_unread(
    tmp_path: Path,
) -> None:
    """A FIFO blocked the reader for ever and /dev/zero was read until memory ran out."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(SecretError, match="not a regular file"):
        load_secret({SECRET_FILE_ENV: str(fifo)})
    with pytest.raises(SecretError, match="not a regular file"):
        load_secret({SECRET_FILE_ENV: "/dev/zero", "PRIVGW_SECRET_FILE_SHARED": "1"})
    big = tmp_path / "big"
    big.write_bytes(os.urandom(8192))
    big.chmod(0o600)
    with pytest.raises(SecretError, match="larger than a secret"):
        load_secret({SECRET_FILE_ENV: str(big)})


def test_a_secret_variable_that_is_not_utf8_is_refused_without_its_bytes() -> None:
    text = "CANARY-secret-0123456789-\udcff\udcfe"  # undecodable bytes, as os.environ keeps them
    with pytest.raises(SecretError, match="not UTF-8") as info:
        load_secret({SECRET_ENV: text})
    assert "CANARY" not in str(info.value)


def test_load_secret_too_short_names_the_source_not_the_secret(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match=SECRET_ENV) as info:
        load_secret({SECRET_ENV: "tiny-sec"})
    assert "tiny-sec" not in str(info.value)
    f = tmp_path / "secret"
    f.write_bytes(b"tiny-sec\n")
    with pytest.raises(SecretError, match=SECRET_FILE_ENV):
        load_secret({SECRET_FILE_ENV: str(f)})


def test_generate_secret_file(tmp_path: Path) -> None:
    f = tmp_path / "sub" / "secret.key"
    with pytest.raises(SecretError, match="does not exist"):  # no directory is created
        generate_secret_file(f)
    assert not f.parent.exists()
    f.parent.mkdir()
    generate_secret_file(f)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    content = f.read_bytes()
    assert len(content) == 65
    assert len(bytes.fromhex(content.decode().strip())) == 32
    secret = load_secret({SECRET_FILE_ENV: str(f)})
    assert Keyring(secret).fingerprint()
    other = tmp_path / "other.key"
    generate_secret_file(other)
    assert other.read_bytes() != content


def test_generate_secret_file_never_overwrites(tmp_path: Path) -> None:
    f = tmp_path / "secret.key"
    generate_secret_file(f)
    before = f.read_bytes()
    with pytest.raises(SecretError, match="already exists"):
        generate_secret_file(f)
    assert f.read_bytes() == before


# --- secret hygiene (issue 32, item 5) ---------------------------------------------------------


@pytest.mark.parametrize("weak", [" " * 16, "hex:" + "00" * 16, "ab" * 12, "aaaaaaaaaaaaaaab"])
def test_a_guessable_secret_is_refused_with_the_fix(weak: str) -> None:
    with pytest.raises(SecretError) as err:
        load_secret({SECRET_ENV: weak})
    message = str(err.value)
    assert "too little entropy" in message and "privgw secret create" in message
    assert weak not in message and "-0 bits" not in message


def test_a_generated_secret_and_a_long_passphrase_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "k"
    generate_secret_file(path)
    assert len(load_secret({SECRET_FILE_ENV: str(path)})) == 64
    assert load_secret({SECRET_ENV: "correct horse battery staple"})


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_secret_file_readable_by_others_is_refused_unless_opted_in(
    tmp_path: Path, mode: int, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "k"
    generate_secret_file(path)
    path.chmod(mode)
    with pytest.raises(SecretError) as err:
        load_secret({SECRET_FILE_ENV: str(path)})
    assert f"mode {mode:03o}" in str(err.value) and f"chmod 600 {path}" in str(err.value)
    with caplog.at_level(logging.WARNING):
        assert load_secret({SECRET_FILE_ENV: str(path), "PRIVGW_SECRET_FILE_SHARED": "1"})
    assert any("readable by group or others" in r.getMessage() for r in caplog.records)
