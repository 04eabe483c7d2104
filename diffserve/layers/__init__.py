"""Kernel layers: ``Linear`` and ``Attention`` with backends chosen at construction,
plus call counters."""
