"""Developer and test support: never imported by the trainer's hooks."""
