"""Linear layers: the backend contract, one backend per file, the ``Linear`` module."""
