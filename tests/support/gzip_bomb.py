"""A gzip bomb: a JSON object of 256 MiB decoded, about a megabyte on the wire."""

from __future__ import annotations

import functools
import zlib

PAD_BYTES = 256 * 1024 * 1024
_CHUNK = b" " * (1024 * 1024)


@functools.cache
def gzip_bomb(opening: bytes) -> bytes:
    """``opening`` (a JSON object without its closing brace) and a ``"pad"`` field of ``PAD_BYTES``
    spaces, gzipped; compressed a chunk at a time, never whole in memory (as one 256 MiB bytes it
    cost ~1 s of CPU and 512 MiB of memory a test)."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # the gzip container
    parts = [compressor.compress(opening + b', "pad": "')]
    parts += [compressor.compress(_CHUNK) for _ in range(PAD_BYTES // len(_CHUNK))]
    parts += [compressor.compress(b'"}'), compressor.flush()]
    bomb = b"".join(parts)
    assert len(bomb) < 2 * 1024 * 1024
    return bomb
