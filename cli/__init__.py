"""``dq`` subcommands; each module has ``register(subparsers)`` (see ``cli/main.py``)."""

__all__: list[str] = []
