"""Replication: a leader ships its WAL to followers, etcd decides who leads
(docs/replication.md).

The package itself exports nothing: import from its modules.
"""

__all__: list[str] = []
