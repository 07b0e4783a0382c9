"""The ``miles-nemogym`` command line: one subcommand module per feature."""

__all__: list[str] = []
