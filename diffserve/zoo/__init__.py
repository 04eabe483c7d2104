"""Test and demo models: hermetic random-weight builders (FLUX, SD3, PixArt-Sigma, LoRA
files), the locally made tokenizers, and the toy-shapes model's CPU trainer and image
checker. Fixtures, not serving code: they write diffusers-layout directories that the
serving layers load like any checkpoint, and import only ``errors``, ``logging`` and
``registry`` (tests/test_layering.py). ``diffserve make-model`` is their CLI."""
