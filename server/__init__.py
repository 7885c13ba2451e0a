"""Deadline Queue: the HTTP server (``create_app`` in ``dq.server.app``, ``dq serve``).

The package itself exports nothing: import from its modules.
"""

__all__: list[str] = []
