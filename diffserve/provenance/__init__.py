"""Provenance: every image and video carries a signed manifest of what made it
(docs/provenance.md). ``facts`` says what made it, ``manifest`` builds and signs the
C2PA-shaped JSON, ``keys`` holds the Ed25519 key, ``images`` and ``video`` bind a
manifest to a file's pixels or packets and embed it, ``verify`` checks a file.

Import is cheap: Pillow, PyAV and ``cryptography`` load inside the functions that use
them.
"""
