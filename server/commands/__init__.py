"""``dq`` subcommands; each module has ``register(subparsers)`` (see ``server/cli.py``)."""
