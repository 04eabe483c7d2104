"""Hub ids as models: ``org/name[@revision]`` resolved to a snapshot directory in the
Hugging Face cache.

Offline first: with ``HF_HUB_OFFLINE=1`` (or when the hub cannot be reached) the
snapshot comes from the cache only, and a model missing there is an error naming the
cache and the command that fetches it. Online, only the files the deployment loads are
fetched: ``model_index.json``, the marker file and, per component the pipeline runs, its
configs, tokenizer files and non-variant safetensors. Never a pickle (``.bin``/``.pt``),
never a variant (``.fp16.safetensors``), never a root-level single-file checkpoint. A
missing, gated or private repository online is an error, never a fall back to an older
cached copy.

``huggingface_hub`` is imported only when a hub id is resolved, so importing the config
stays cheap.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diffserve.errors import ConfigError
from diffserve.logging import get_logger

logger = get_logger(__name__)

# org/name with an optional @revision (a branch, a tag or a commit hash); the hub's own
# name rules.
HUB_ID = re.compile(
    r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$"
)
DEFAULT_REVISION = "main"
# Top-level files a diffusers-format snapshot needs besides its components' folders.
ROOT_FILES = ("model_index.json", "diffserve_model.json")
# Per-component files that are loaded: configs, tokenizer files and safetensors weights.
COMPONENT_SUFFIXES = (".json", ".txt", ".model", ".safetensors", ".tiktoken")
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class HubSnapshot:
    """A resolved hub id: the repository, the revision asked for, the commit it named,
    the local folder."""

    repo_id: str
    revision: str
    commit: str
    path: str
    # Files fetched from the hub by this resolution (empty when the cache had everything
    # or offline).
    downloaded: tuple[str, ...] = ()


def parse_hub_id(text: str) -> tuple[str, str] | None:
    """``(repo_id, revision)`` when ``text`` reads as a hub id, else None."""
    match = HUB_ID.match(text)
    if match is None or text.startswith((".", "~")):
        return None
    return match["repo"], match["revision"] or DEFAULT_REVISION


def hub_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The hub cache as huggingface_hub computes it, read from the environment now (not
    at its import)."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_offline(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def fetch_command(repo_id: str, revision: str) -> str:
    rev = "" if revision == DEFAULT_REVISION else f" --revision {revision}"
    return (
        f"HF_HUB_OFFLINE=0 hf download {repo_id}{rev} --include "
        "'model_index.json' '*/*.json' '*/*.safetensors' '*/*.txt' "
        "'*/*.model'"
    )


def needed_files(
    index: Mapping[str, Any],
    repo_files: Iterable[str],
    skip_weights_of: Iterable[str] = (),
) -> list[str]:
    """The files of a diffusers-format repository that loading its pipeline reads.

    ``index`` is its model_index.json: every component named there with a library and a
    class is loaded (``[null, null]`` entries are not). ``skip_weights_of`` names
    components whose weights come from elsewhere (a single-file checkpoint): their
    configs are still fetched, their safetensors are not.
    """
    components = {
        name
        for name, value in index.items()
        if not name.startswith("_")
        and isinstance(value, list)
        and len(value) == 2
        and all(value)
    }
    skipped = set(skip_weights_of)
    chosen = []
    for name in sorted(repo_files):
        folder, _, filename = name.rpartition("/")
        if not folder:
            if name in ROOT_FILES:
                chosen.append(name)
            continue
        if (
            "/" in folder
            or folder not in components
            or not filename.endswith(COMPONENT_SUFFIXES)
        ):
            continue
        # stem.safetensors and stem-0000k-of-0000n.safetensors;
        # stem.<variant>.safetensors is a variant.
        if filename.endswith(".safetensors") and (
            folder in skipped or filename.count(".") != 1
        ):
            continue
        chosen.append(name)
    return chosen


def resolve_hub_model(
    text: str,
    *,
    skip_weights_of: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> HubSnapshot:
    """Resolve ``org/name[@revision]`` to a snapshot folder (cache only when offline).
    Raises ConfigError."""
    parsed = parse_hub_id(text)
    if parsed is None:
        raise ConfigError(
            f"{text!r} is not a hub id",
            path="model",
            hint="write org/name or org/name@revision",
        )
    repo_id, revision = parsed
    env = os.environ if environ is None else environ
    cache = hub_cache_dir(env)
    if hub_offline(env):
        return _from_cache(repo_id, revision, cache, reason="HF_HUB_OFFLINE=1")
    return _download(
        repo_id, revision, cache, env.get("HF_ENDPOINT") or None, skip_weights_of
    )


def _from_cache(
    repo_id: str, revision: str, cache: Path, *, reason: str
) -> HubSnapshot:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = snapshot_download(
            repo_id, revision=revision, cache_dir=str(cache), local_files_only=True
        )
    except (LocalEntryNotFoundError, OSError, ValueError):
        raise ConfigError(
            f"{repo_id}@{revision} is not a local directory and "
            f"not in the Hugging Face cache at {cache} "
            f"({reason}: nothing is downloaded)",
            path="model",
            source=f"{repo_id}@{revision}",
            hint="run once online (HF_HUB_OFFLINE=0: only the files "
            "the pipeline loads are fetched), or "
            f"`{fetch_command(repo_id, revision)}`, or set HF_HUB_CACHE "
            "to the cache that holds it",
        ) from None
    return _checked(HubSnapshot(repo_id, revision, Path(folder).name, folder))


def _download(
    repo_id: str,
    revision: str,
    cache: Path,
    endpoint: str | None,
    skip_weights_of: Iterable[str],
) -> HubSnapshot:
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = endpoint or "the Hugging Face hub"
    api = HfApi(endpoint=endpoint)
    try:
        info = api.model_info(repo_id, revision=revision)
        commit = info.sha or revision
        files = [s.rfilename for s in info.siblings or ()]
        if "model_index.json" not in files:
            raise ConfigError(
                f"{repo_id}@{revision} has no model_index.json: not "
                "a diffusers-format repository",
                path="model",
                source=where,
                hint="point at a diffusers-format repository (single-file "
                "checkpoints: see docs/models.md)",
            )
        index_path = hf_hub_download(
            repo_id,
            "model_index.json",
            revision=commit,
            cache_dir=str(cache),
            endpoint=endpoint,
        )
        index = json.loads(Path(index_path).read_text(encoding="utf-8"))
        wanted = needed_files(index, files, skip_weights_of)
        before = _cached_files(cache, repo_id, commit)
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=str(cache),
            endpoint=endpoint,
            allow_patterns=wanted,
        )
    except GatedRepoError:
        raise ConfigError(
            f"{repo_id} is gated on {where} and this machine's token has no access",
            path="model",
            source=f"{repo_id}@{revision}",
            hint="accept the model's terms on its page and set HF_TOKEN "
            "(or `hf auth login`)",
        ) from None
    except RevisionNotFoundError:
        raise ConfigError(
            f"{repo_id} has no revision {revision!r} on {where}",
            path="model",
            source=f"{repo_id}@{revision}",
            hint="use an existing branch, tag or commit hash",
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"repository {repo_id} not found on {where} (or it is "
            "private and no token grants "
            "access)",
            path="model",
            source=f"{repo_id}@{revision}",
            hint="check the id; for a private repository set HF_TOKEN",
        ) from None
    except (EntryNotFoundError, RemoteEntryNotFoundError) as exc:
        raise ConfigError(
            f"{repo_id}@{revision}: a file went missing while downloading: {exc}",
            path="model",
            source=where,
        ) from None
    except _transport_errors() as exc:
        logger.warning(
            "the hub at %s cannot be reached (%s): using the cache at %s",
            where,
            exc,
            cache,
        )
        return _from_cache(repo_id, revision, cache, reason=f"{where} unreachable")
    except HfHubHTTPError as exc:
        raise ConfigError(
            f"{repo_id}@{revision}: {where} answered an error: {exc}",
            path="model",
            source=f"{repo_id}@{revision}",
        ) from None
    after = _cached_files(cache, repo_id, commit)
    logger.info(
        "hub model %s@%s -> commit %s (%d files, %d downloaded)",
        repo_id,
        revision,
        commit,
        len(wanted),
        len(after - before),
    )
    return _checked(
        HubSnapshot(
            repo_id, revision, Path(folder).name, folder, tuple(sorted(after - before))
        )
    )


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's "could not reach the server" errors (huggingface_hub 2 uses
    httpx2, 1.x httpx)."""
    errors: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            client = importlib.import_module(name)
        except ImportError:
            continue
        errors += [client.ConnectError, client.TimeoutException]
    return tuple(errors)


def _cached_files(cache: Path, repo_id: str, commit: str) -> set[str]:
    folder = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit
    return (
        {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
        if folder.is_dir()
        else set()
    )


def _checked(snapshot: HubSnapshot) -> HubSnapshot:
    if not (Path(snapshot.path) / "model_index.json").is_file():
        raise ConfigError(
            f"{snapshot.repo_id}@{snapshot.revision} (commit {snapshot.commit}) "
            "in the cache has no "
            "model_index.json: not a diffusers-format snapshot",
            path="model",
            source=snapshot.path,
            hint="point at a diffusers-format repository",
        )
    return snapshot
