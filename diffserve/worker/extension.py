"""Worker extensions: a narrow hook interface instead of splicing classes into the
worker's MRO.

An extension is named by ``stage.worker_extension_cls`` (a dotted path). The worker
instantiates it once, calls ``before_load(worker)`` before the pipeline is built (where
it may install a kernel observer with ``worker.observe_kernels``, see
``layers/observe.py``) and ``after_load(worker)`` once the model exists. Its public
methods are callable through ``collective_rpc``; they run in the worker between batches,
never during a forward.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from diffserve.errors import ConfigError
from diffserve.logging import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.config.schema import StageConfig
    from diffserve.layers.observe import KernelObserver
    from diffserve.models.base import Pipeline

logger = get_logger(__name__)

# Names an RPC can never reach: the hooks are lifecycle calls owned by the worker, not
# remote verbs.
_RESERVED = frozenset({"before_load", "after_load"})


class WorkerHandle(Protocol):
    """What an extension sees of its worker (``worker.Worker`` implements it)."""

    rank: int
    device: str
    config: ResolvedConfig
    stage: StageConfig
    pipeline: Pipeline | None

    def observe_kernels(self, observer: KernelObserver) -> None: ...


class WorkerExtension:
    """Base class for worker extensions. Subclasses override the hooks and add public
    RPC methods."""

    def before_load(self, worker: WorkerHandle) -> None:
        """Called in the worker before the pipeline is built."""

    def after_load(self, worker: WorkerHandle) -> None:
        """Called in the worker after the pipeline is built (and before any request
        runs)."""

    def rpc_method(self, name: str) -> Callable[..., Any] | None:
        """Return the bound public method ``name`` if an RPC may call it, else
        ``None``."""
        if name.startswith("_") or name in _RESERVED or name == "rpc_method":
            return None
        method = getattr(self, name, None)
        return method if callable(method) else None


def load_extension(dotted_path: str | None) -> WorkerExtension | None:
    """Import and instantiate ``package.module.ClassName``; ``None`` means no extension.

    A wrong path is a config error: it names the key and the fix, so a typo never
    becomes a worker that silently serves without the extension the deploy file asked
    for.
    """
    if not dotted_path:
        return None
    module_name, _, class_name = dotted_path.rpartition(".")
    if not module_name:
        raise ConfigError(
            f"{dotted_path!r} is not a dotted path 'package.module.Class'",
            path="worker_extension_cls",
        )
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"cannot import {dotted_path!r}: {exc}",
            path="worker_extension_cls",
            hint="the module must be importable in the worker process",
        ) from exc
    _check_extension_class(dotted_path, cls)
    instance = cls()
    logger.info("worker extension %s loaded", dotted_path)
    return instance


def _check_extension_class(dotted_path: str, cls: object) -> None:
    """Refuse anything but an extension class, before calling it.

    Importing the module already ran its code (the deploy config is trusted, see
    docs/security.md), but the named attribute is only ever instantiated once it is
    known to be an extension: a function or other callable named here by mistake is
    never called, and a class without the hooks is never instantiated. Duck-typed
    extensions (a class with callable ``before_load`` and ``after_load``) are accepted,
    as documented.
    """
    if not isinstance(cls, type):
        raise ConfigError(
            f"{dotted_path!r} is a {type(cls).__name__}, not a class; "
            "it was not called",
            path="worker_extension_cls",
            hint="name a subclass of diffserve.worker.extension.WorkerExtension",
        )
    if issubclass(cls, WorkerExtension):
        return
    for hook in ("before_load", "after_load"):
        if not callable(getattr(cls, hook, None)):
            raise ConfigError(
                f"{dotted_path!r} has no {hook}() hook",
                path="worker_extension_cls",
                hint="subclass diffserve.worker.extension.WorkerExtension",
            )


def extension_method(extension: Any, name: str) -> Callable[..., Any] | None:
    """The method an RPC named ``name`` reaches on ``extension`` (duck-typed extensions
    included)."""
    finder = getattr(extension, "rpc_method", None)
    if callable(finder):
        return finder(name)
    if name.startswith("_") or name in _RESERVED:
        return None
    method = getattr(extension, name, None)
    return method if callable(method) else None
