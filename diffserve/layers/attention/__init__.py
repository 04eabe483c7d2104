"""Attention call sites: the backend contract, one backend per file, the ``Attention``
module."""
