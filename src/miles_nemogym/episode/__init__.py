"""One episode of either kind: ``swe`` (``POST /run``) and ``environment`` (the ``simple_agent``
loop), each prepared then run by ``runtime.deliver`` (abort, the circuits, the resend rule), ending in
``record``'s ``Outcome`` and the record on every sample with its one reader. Imports no hook
and no tool."""
