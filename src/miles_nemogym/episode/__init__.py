"""One ``/run`` episode, stage by stage: ``request`` (policy URL, body), ``send`` (abort registry,
connection pool, the one resend rule, through ``circuit``), ``outcome`` (answer → ``Outcome`` →
record), and ``record`` (the record on every sample and its one reader). Imports no hook and
nothing from ``rollout``."""
