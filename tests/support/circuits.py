"""Test-only views of the runtime's circuits and held episodes (the runtime itself never asks)."""

from __future__ import annotations

from miles_nemogym.runtime import Circuit, Circuits, HeldEpisodes


def is_open(circuit: Circuit | Circuits) -> bool:
    """Whether ``circuit`` (or any of ``Circuits``) is open: its server's episodes wait."""
    if isinstance(circuit, Circuits):
        return any(map(is_open, circuit.all()))
    with circuit._lock:
        return circuit._open


def waiting_episodes(circuits: Circuits) -> int:
    """The episodes waiting on every circuit."""
    return sum(one.waiting() for one in circuits.all())


def held_count(held: HeldEpisodes) -> int:
    """The failed episodes ``held`` keeps."""
    with held._lock:
        return len(held._episodes)


def reset(circuits: Circuits) -> None:
    """No circuit, so no outage and no stop error; whatever still waits on one is woken."""
    with circuits._lock:
        every = list(circuits._by_url.values())
        circuits._by_url.clear()
    for one in every:
        one.delivered()
