"""HTTP routers; each owns its prefix and tags (``app.py`` only wires them)."""

__all__: list[str] = []
