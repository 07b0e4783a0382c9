"""Ports ``serve`` and the tests pick: outside the ephemeral range, never one that is held."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from miles_nemogym.gym import server
from miles_nemogym.gym.server import free_port


def test_picked_ports_are_outside_the_ephemeral_range() -> None:
    low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    picked = {free_port() for _ in range(50)}
    assert all(not low <= port <= high for port in picked), sorted(picked)
    assert len(picked) > 40  # spread out: two processes picking at once rarely agree


def test_a_held_port_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        held = holder.getsockname()[1]
        monkeypatch.setattr(server, "_listen_ports", lambda: range(held, held + 1))
        port = free_port()  # the only candidate is held: falls back to a port the OS gives
        assert port != held
        with socket.socket() as check:
            check.bind(("127.0.0.1", port))


def test_a_bracketed_ipv6_host_falls_back_to_a_port_the_os_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET6) as holder:
        holder.bind(("::1", 0))
        held = holder.getsockname()[1]
        monkeypatch.setattr(server, "_listen_ports", lambda: range(held, held + 1))
        port = free_port("[::1]")  # the crowded-range fallback binds the host without its brackets
        assert port != held
        with socket.socket(socket.AF_INET6) as check:
            check.bind(("::1", port))
