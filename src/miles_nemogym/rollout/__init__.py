"""What the Miles hooks share across a rollout step: reading samples, the episode ledger, roles, the run stop."""
