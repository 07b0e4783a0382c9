"""A free loopback port, for servers a test starts or URLs where nothing listens."""

from __future__ import annotations

from miles_nemogym.gym.server import free_port as _free_port


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds, outside the ephemeral range (as ``serve`` picks)."""
    return _free_port("127.0.0.1")
