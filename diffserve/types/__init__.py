"""The envelopes every layer shares: requests, progress and results, the worker wire
messages and the channels that carry them. A leaf package: it imports nothing of
diffserve but ``errors``/``logging``."""
