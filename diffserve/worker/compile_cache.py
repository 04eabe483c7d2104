"""Where a compiling worker keeps torch's compile caches, so that its next start reuses
them.

With ``enforce_eager: false`` the transformer blocks are compiled by inductor on first
use. Inductor's on-disk caches, the FX graph cache (generated kernels, built shared
libraries) and the AOTAutograd cache (the compiled graph of each traced frame), live
under ``TORCHINDUCTOR_CACHE_DIR``, which torch reads each time it looks an entry up.
``use_compile_cache`` points that variable, in the worker's own process (uni: the
engine's process; mp and ray: each rank's process), at one directory per deployment::

    $DIFFSERVE_CACHE_DIR/compile/<model dir name>-<key>     (DIFFSERVE_CACHE_DIR
    default: ~/.cache/diffserve)

``<key>`` is a hash of the model path, the config fingerprint, the torch version, the
CPU capability (``torch.backends.cpu.get_cpu_capability()``), the CPU kind
(``config/platform.py:cpu_kind``: AMX, AVX512_BF16, AVX512, AVX2, which torch's
capability does not tell apart) and the device type; ``key.json`` in the directory lists
them. Deleting a directory (or all of ``compile/``) clears the cache: the next start
compiles again.

A restart still traces the two block classes with dynamo (that is not cached), but every
graph is then a cache hit instead of an inductor compile. The same directory also
remembers inductor's SIMD probe (``vec_isa.json``, see ``_reuse_vec_isa_probe``).
``torch.compiler.save_cache_artifacts`` (the portable "mega-cache") is not used: it
packs these same caches into bytes to carry them to another machine, and here they
already persist in place.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from diffserve.config.platform import cpu_kind
from diffserve.logging import get_logger

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.config.resolved import ResolvedConfig

logger = get_logger(__name__)

CACHE_DIR_ENV = "DIFFSERVE_CACHE_DIR"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
_VEC_ISA_FILE = "vec_isa.json"


@dataclass(frozen=True)
class CompileCacheKey:
    """What a compiled artifact depends on beyond what inductor's own cache keys already
    check."""

    model: str
    fingerprint: str
    torch_version: str
    cpu_capability: str
    cpu_kind: str
    device: str

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def dirname(self) -> str:
        name = "".join(
            c if c.isalnum() or c in "-_." else "_" for c in Path(self.model).name
        )[:48]
        return f"{name or 'model'}-{self.digest()}"


def cache_root(environ: Any = None) -> Path:
    """``$DIFFSERVE_CACHE_DIR/compile``, else ``~/.cache/diffserve/compile``."""
    environ = os.environ if environ is None else environ
    base = environ.get(CACHE_DIR_ENV)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "diffserve"
    return root / "compile"


def key_for(config: ResolvedConfig, device: torch.device | str) -> CompileCacheKey:
    model = str(config.model or "")
    if model and Path(model).expanduser().exists():
        model = str(Path(model).expanduser().resolve())
    return CompileCacheKey(
        model=model,
        fingerprint=config.fingerprint,
        torch_version=torch.__version__,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_kind=cpu_kind().name,
        device=torch.device(device).type,
    )


def compile_cache_dir(key: CompileCacheKey, environ: Any = None) -> Path:
    return cache_root(environ) / key.dirname()


def use_compile_cache(
    config: ResolvedConfig, device: torch.device | str
) -> Path | None:
    """Point this process's inductor caches at the deployment's directory; call before
    anything compiles.

    Returns the directory, or ``None`` when it cannot be created (compiling still works,
    with torch's default cache in the temp directory, which does not survive a
    reboot)."""
    key = key_for(config, device)
    directory = compile_cache_dir(key)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        key_file = directory / "key.json"
        if not key_file.exists():
            _write_json(key_file, asdict(key))
    except OSError as exc:
        logger.warning(
            "compile cache %s is not writable (%s): using torch's default cache",
            directory,
            exc,
        )
        return None
    os.environ[INDUCTOR_CACHE_ENV] = str(directory)
    _reuse_vec_isa_probe(directory)
    logger.info("compile cache: %s", directory)
    return directory


def _reuse_vec_isa_probe(directory: Path) -> None:
    """Skip inductor's per-process SIMD probe when this directory has already seen it
    succeed.

    Before its first CPU kernel, inductor checks every SIMD ISA the CPU reports by
    compiling a test library with its flags and loading it in a child Python (1-2 s per
    process on 2 cores). The first start probes and records the ISAs that passed; when
    all of them passed, that start and every later one of the same key (same CPU
    capability) whose CPU reports exactly those ISAs set inductor's own switch
    ``cpp.vec_isa_ok``, so later starts do not probe again. The narrower checks (VNNI,
    AVX512-BF16, AMX) still run. Nothing is changed when the operator set
    ``TORCHINDUCTOR_VEC_ISA_OK``, on non-x86 CPUs, or when any probe failed."""
    try:
        from torch._inductor import config as inductor_config
        from torch._inductor import cpu_vec_isa
    except Exception:  # pragma: no cover - a torch without inductor
        return
    if inductor_config.cpp.vec_isa_ok is not None:
        return
    try:
        flags = cpu_vec_isa.x86_isa_checker()
        reported = [
            str(isa)
            for isa in cpu_vec_isa.supported_vec_isa_list
            if flags and all(flag in flags for flag in str(isa).split())
        ]
        if not reported:
            return
        marker = directory / _VEC_ISA_FILE
        recorded = _read_json(marker)
        if recorded is None:
            # Probes; torch caches it.
            recorded = {
                "reported": reported,
                "passed": [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()],
            }
            _write_json(marker, recorded)
        # Set on the probing start too: the switch is part of inductor's cache keys, so
        # every start of this directory must compile under the same value or the second
        # start would miss the first one's graphs.
        if recorded.get("reported") == reported and recorded.get("passed") == reported:
            inductor_config.cpp.vec_isa_ok = True
    except Exception as exc:  # private torch API: never let it stop a load
        logger.debug("SIMD probe memo skipped: %s", exc)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
