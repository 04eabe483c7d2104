"""The kernel-observation hook: see, and optionally wrap, every backend a model is built
with.

A ``KernelObserver`` is handed to ``build_kernel_set`` (the worker passes the ones its
extension registered with ``worker.observe_kernels``). For each selection it gets the
kind, the name the config asked for and the backend object chosen, and returns the
backend the model will use: the same object, or a wrapper around it. Tests and operators
use it to prove at call time which kernel ran, without patching module globals.

The returned object must keep the backend contract (``linear`` or ``attention``,
``name``); the module records ``backend.name`` at construction, so the attestation
reports the name the observer returned.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from diffserve.layers.backend import KernelBackend

KernelKind = Literal["linear", "attention"]


@runtime_checkable
class KernelObserver(Protocol):
    def on_select(
        self, kind: KernelKind, requested: str, backend: KernelBackend
    ) -> KernelBackend:
        """Called once per selection while the model is built; returns the backend to
        use."""
        ...
