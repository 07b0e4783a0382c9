"""What this process keeps across episodes, all of it here, with one ``reset``.

Miles calls each hook with no object of ours, so what one hook leaves for another lives in the
process:

    ledger           ledger.Ledger       every finished episode and group decision, the
                                                 failure streak (agent.run, the filter, the log functions)
    circuits         episode/delivery.Circuits   one per server: outage waits and the outage stop
    in_flight        episode/delivery.InFlight   the episodes ``agent.abort`` (and a run stop) cancel
    held             salvage.HeldEpisodes        failed episodes waiting for their ABORTED sample
    stores           store/writer.Stores         the episode stores open in this process
    reward_problems  Counter                     samples the reward hook scored 0.0, by reason

and three caches kept by their own modules: the settings read from the environment
(``settings.get_settings``), the messages logged once (``log_once``) and the local address that
routes to each Gym host (``run.routable_local_address``). ``reset`` returns all of it to a fresh
process's (tests; a new run in the same process). The connection pools are per event loop and
close with it (``transport``).
"""

from __future__ import annotations

from collections import Counter

from miles_nemogym import log_once, settings
from miles_nemogym.episode.delivery import Circuits, InFlight
from miles_nemogym.episode.run import routable_local_address
from miles_nemogym.ledger import Ledger
from miles_nemogym.salvage import HeldEpisodes
from miles_nemogym.store.writer import Stores

__all__ = ["circuits", "held", "in_flight", "ledger", "reset", "reward_problems", "stores"]

ledger = Ledger()
circuits = Circuits()
in_flight = InFlight()
held = HeldEpisodes()
stores = Stores()
reward_problems: Counter[str] = Counter()


def reset() -> None:
    """Everything above as in a fresh process: no circuit, nothing in the ledger, held or counted,
    every store closed (what was queued is written), the caches emptied."""
    circuits.reset()
    ledger.reset()
    held.clear()
    stores.close()
    reward_problems.clear()
    log_once.reset()
    settings.reset()
    routable_local_address.cache_clear()
