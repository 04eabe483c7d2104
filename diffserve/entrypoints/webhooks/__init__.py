"""Signed job webhooks (docs/webhooks.md): the signing, the URL policy, the dispatcher
that delivers the job store's outbox (``jobs/outbox.py``), and their setup."""
