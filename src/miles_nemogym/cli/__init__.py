"""The ``miles-nemogym`` command line: one subcommand module per feature."""
