"""One episode: ``run`` (a ``POST /run``: SWE or an agent row) or ``environment`` (the ``simple_agent``
loop), run by ``runtime.deliver`` and ending in ``record``'s ``Outcome``. Imports no hook and no tool."""
