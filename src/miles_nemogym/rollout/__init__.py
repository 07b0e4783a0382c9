"""What the Miles hooks share across a rollout step: the episode ledger and the run stop."""
