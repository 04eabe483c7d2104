"""Step caches (First-Block Cache, TeaCache): per image row and per CFG branch, decide
at every denoise step whether the transformer's blocks run or their cached residual is
reused, and record why.

``policy`` holds the decision rules and the per-row trace, ``teacache`` the published
rescaling polynomial, ``report`` the per-image attestation entries. The model decides
what the probe and the cached residual are (``models/flux/step_cache.py`` for FLUX)."""
