"""The project's exception types. Every user-facing failure is one of these."""

from __future__ import annotations


class DiffserveError(Exception):
    """Base class of every error diffserve raises on purpose."""


class ConfigError(DiffserveError, ValueError):
    """A deploy config, override or flag is invalid.

    The message always names where the bad value came from (``source``: file:line,
    ``cli``, ``env``), the dotted key ``path``, the rule it broke and a ``hint`` for
    fixing it.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        source: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = path
        self.source = source
        self.hint = hint
        self.rule = message
        parts = []
        if source:
            parts.append(f"{source}:")
        if path:
            parts.append(f"{path}:")
        parts.append(message)
        text = " ".join(parts)
        if hint:
            text += f" (fix: {hint})"
        super().__init__(text)


class ConfigErrors(ConfigError):
    """Several config problems found in one pass (``config validate`` prints all of
    them)."""

    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = list(errors)
        super().__init__("; ".join(str(e) for e in self.errors) or "invalid config")
        # ConfigError.__init__ formats a single problem; keep the joined text as the
        # message.
        self.args = ("\n".join(str(e) for e in self.errors),)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


class BackendUnavailableError(DiffserveError, RuntimeError):
    """A kernel backend was requested explicitly but cannot run here (missing package or
    device)."""


class ModelLoadError(DiffserveError, RuntimeError):
    """A model directory is missing files, or its weights do not match the
    architecture."""


class RequestError(DiffserveError, ValueError):
    """A generation request is invalid. ``param`` names the offending field (for HTTP
    400 bodies)."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str = "invalid_value"
    ) -> None:
        self.param = param
        self.code = code
        super().__init__(message)


class LoraError(DiffserveError, ValueError):
    """A LoRA file cannot be used with this model (missing, not safetensors, keys
    matching no layer, shapes or ranks that do not fit). A ConfigError at start for
    registered adapters, an HTTP 400 per request."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.hint = hint
        super().__init__(f"{message} (fix: {hint})" if hint else message)


class LimitExceededError(RequestError):
    """A value is well-formed but above what this deployment allows (``server.*``; HTTP
    422)."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param, code="limit_exceeded")


class RequestAbortedError(DiffserveError):
    """The request was aborted (by the caller or a client disconnect) before it
    finished."""


class EngineDeadError(DiffserveError, RuntimeError):
    """A worker died or the engine was shut down; no further requests can be served."""


class StageUnavailableError(DiffserveError, RuntimeError):
    """One stage cannot serve this request now (an AR stage's vLLM engine died or missed
    its deadline), while the engine's other stages still serve requests that skip it
    (HTTP 503 naming the stage)."""


class WorkerError(DiffserveError, RuntimeError):
    """Code inside a worker raised; carries the remote exception type and traceback
    text."""

    def __init__(
        self,
        message: str,
        *,
        remote_type: str | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback
        super().__init__(message)


class EngineOverloadedError(DiffserveError, RuntimeError):
    """The engine's request queue is full (HTTP 429); retry later."""


class EngineNotReadyError(DiffserveError, RuntimeError):
    """The engine is still loading or warming up (HTTP 503)."""
