"""The engine process's connection read into one buffer: what Connection.recv_bytes reads."""

from __future__ import annotations

import os
import struct
import threading
from multiprocessing import Pipe

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_jobs.engine_process.framing import receive


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=40_000), max_size=5), st.sampled_from([0, 1, 70_000, 3 << 20]))
def test_messages_read_back_as_sent_through_a_real_pipe(messages: list[bytes], big: int) -> None:
    """Small messages (sent with their header), larger ones (header apart), one beyond a
    socket's buffer (read in many pieces), in turn with the library's own reading."""
    ours, theirs = Pipe()
    sent = [*messages, os.urandom(big)]
    writer = threading.Thread(target=lambda: [theirs.send_bytes(m) for m in sent])
    writer.start()
    try:
        got = [receive(ours) if i % 2 == 0 else ours.recv_bytes() for i in range(len(sent))]
    finally:
        writer.join()
        ours.close()
        theirs.close()
    assert got == sent


def test_the_size_beyond_2_gib_is_read_from_its_long_header() -> None:
    ours, theirs = Pipe()
    os.write(theirs.fileno(), struct.pack("!i", -1) + struct.pack("!Q", 5) + b"hello")
    assert receive(ours) == b"hello"
    ours.close()
    theirs.close()


def test_a_message_cut_short_is_an_eof() -> None:
    ours, theirs = Pipe()
    os.write(theirs.fileno(), struct.pack("!i", 100) + b"only part")
    theirs.close()
    with pytest.raises(EOFError):
        receive(ours)
    ours.close()
