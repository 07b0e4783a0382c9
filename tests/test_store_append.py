"""The store's appender: byte-exact appends whether whole blocks go direct or all is buffered."""

from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path
from typing import Any

import pytest

from miles_nemogym.store.append import BLOCK, CHUNK, Appender, write_all


def batches(seed: int) -> list[list[bytes]]:
    rng = random.Random(seed)
    sizes = [1, BLOCK - 1, BLOCK, BLOCK + 1, 84_000, 3 * BLOCK, 17, 2 * 1024 * 1024 + 5]
    return [[rng.randbytes(rng.choice(sizes)) for _ in range(rng.randint(1, 6))] for _ in range(25)]


@pytest.mark.parametrize("existing", [b"", b"x" * 10, b"y" * (BLOCK * 2 + 123)])
def test_appends_are_byte_exact_after_every_batch(tmp_path: Path, existing: bytes) -> None:
    path = tmp_path / "pending.jsonl"
    if existing:
        path.write_bytes(existing)
    appender = Appender(path)
    expected = existing
    try:
        for batch in batches(len(existing)):
            appender.write(batch)
            expected += b"".join(batch)
            assert path.read_bytes() == expected  # another process reading now sees every byte
    finally:
        appender.close()
    assert path.read_bytes() == expected


def test_whole_blocks_go_direct_where_the_file_system_allows(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | getattr(os, "O_DIRECT", 0)))
        allowed = hasattr(os, "O_DIRECT")
    except OSError:
        allowed = False
    appender = Appender(tmp_path / "pending.jsonl")
    try:
        assert appender.direct is allowed
    finally:
        appender.close()


def test_a_file_system_without_direct_io_gets_buffered_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def refuse_direct(path: object, flags: int, *args: int) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")  # what tmpfs answers
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", refuse_direct)
    path = tmp_path / "pending.jsonl"
    appender = Appender(path)
    try:
        assert appender.direct is False
        expected = b""
        for batch in batches(7):
            appender.write(batch)
            expected += b"".join(batch)
        assert path.read_bytes() == expected
    finally:
        appender.close()


def refusing_direct(real_pwrite: Any, allowed: int = 0, accepted: list[int] | None = None) -> Any:
    """``os.pwrite`` that refuses descriptors opened with ``O_DIRECT``, as a file system may,
    after ``allowed`` direct writes (their offsets go to ``accepted``)."""
    accepted = [] if accepted is None else accepted

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            if len(accepted) == allowed:
                raise OSError(22, "Invalid argument")
            accepted.append(offset)
        return int(real_pwrite(fd, data, offset))

    return pwrite


def test_direct_writes_refused_midway_fall_back_without_losing_a_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pending.jsonl"
    appender = Appender(path)
    if not appender.direct:
        appender.close()
        pytest.skip("this file system refuses O_DIRECT at open; the buffered path is tested above")
    expected = b""
    try:
        for number, batch in enumerate(batches(3)):
            if number == 5:
                monkeypatch.setattr(os, "pwrite", refusing_direct(os.pwrite))
            appender.write(batch)
            expected += b"".join(batch)
            assert path.read_bytes() == expected
        assert appender.direct is False
    finally:
        appender.close()


def test_write_all_writes_more_buffers_than_one_writev_takes(tmp_path: Path) -> None:
    buffers = [f"{i:05d}".encode() * (i % 7) for i in range(2500)]  # > IOV_MAX, empty ones too
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_all(fd, buffers)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(buffers)


@pytest.mark.parametrize("allowed_direct_writes", [0, 1, 2, 3])
def test_a_refusal_inside_a_batch_larger_than_the_chunk_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, allowed_direct_writes: int
) -> None:
    path = tmp_path / "pending.jsonl"
    path.write_bytes(b"z" * (BLOCK + 7))  # a partial block the first chunk starts with
    appender = Appender(path)
    if not appender.direct:
        appender.close()
        pytest.skip("this file system refuses O_DIRECT at open; the buffered path is tested above")
    direct_writes: list[int] = []
    monkeypatch.setattr(os, "pwrite", refusing_direct(os.pwrite, allowed_direct_writes, direct_writes))
    rng = random.Random(allowed_direct_writes)
    batch = [rng.randbytes(size) for size in (84_000, CHUNK - 3, 17, CHUNK + BLOCK, 84_000)]
    try:
        appender.write(batch)
        appender.write([b"after\n"])
    finally:
        appender.close()
    assert len(direct_writes) == allowed_direct_writes  # the refusal came where it was meant to
    assert path.read_bytes() == b"z" * (BLOCK + 7) + b"".join(batch) + b"after\n"
