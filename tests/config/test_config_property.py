"""Property: arbitrary YAML documents and overrides either resolve or raise ConfigError,
never anything else."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from config_helpers import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffserve.config.fields import FLAT_LEAVES, STAGE_KEYS
from diffserve.config.resolved import ResolvedConfig
from diffserve.errors import ConfigError

# Real key names most of the time, so generated documents reach deep into the resolver.
KEYS = st.one_of(
    st.sampled_from(
        [
            *STAGE_KEYS,
            *FLAT_LEAVES,
            "stages",
            "stage_id",
            "server",
            "topology",
            "platforms",
            "cpu",
            "cuda",
            "default",
            "double_block",
            "single_block",
            "max_n",
            "backend",
            "enabled",
        ]
    ),
    st.text(max_size=8),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**40),
    st.floats(allow_nan=True),
    st.sampled_from(
        [
            "auto",
            "torch",
            "TORCH",
            "sdpa",
            "torch_sdpa",
            "bf16",
            "mp",
            "uni",
            "0",
            "1",
            "0,1",
            "split_text_encoder",
            "single",
            "pkg.mod.Cls",
            "true",
        ]
    ),
    st.text(max_size=6),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=4)
    ),
    max_leaves=12,
)
STAGE_ENTRY = st.dictionaries(KEYS, VALUES, max_size=4) | st.builds(
    lambda sid, body: {"stage_id": sid, **body},
    st.integers(-1, 3),
    st.dictionaries(KEYS, VALUES, max_size=3),
)
DOCS = st.one_of(
    st.dictionaries(KEYS, VALUES, max_size=6),
    st.builds(
        lambda top, stages: {**top, "stages": stages},
        st.dictionaries(KEYS, VALUES, max_size=3),
        st.lists(STAGE_ENTRY, max_size=3),
    ),
    VALUES,
)
ENV = st.dictionaries(
    st.sampled_from(
        ["DIFFSERVE_" + f.upper() for f in FLAT_LEAVES] + ["DIFFSERVE_DTYP", "PATH"]
    ),
    st.text(max_size=6),
    max_size=3,
)

_SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _resolves_or_config_error(**kwargs) -> None:
    try:
        result = run(**kwargs)
    except ConfigError:
        return
    assert isinstance(result, ResolvedConfig)
    assert result.fingerprint and len(result.stages) in (1, 2)


@_SETTINGS
@given(
    doc=DOCS,
    overrides=st.one_of(st.none(), st.dictionaries(KEYS, VALUES, max_size=3)),
    stage_overrides=st.one_of(
        st.none(),
        st.dictionaries(st.one_of(st.integers(-1, 3), KEYS), VALUES, max_size=2),
    ),
    env=ENV,
    platform=st.sampled_from(["cpu", "cuda", "CPU", "tpu"]),
)
def test_arbitrary_documents_resolve_or_raise_config_error(
    doc, overrides, stage_overrides, env, platform
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deploy.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        _resolves_or_config_error(
            deploy_config=path,
            overrides=overrides,
            stage_overrides=stage_overrides,
            env=env,
            platform=platform,
        )
    if isinstance(doc, dict):
        _resolves_or_config_error(deploy_config=doc, overrides=overrides, env=env)


@_SETTINGS
@given(
    text=st.text(
        alphabet=st.sampled_from(list("abdefgt_:-[]{}&*!|>'\"#,. \n01\t?%@`")),
        max_size=60,
    )
)
def test_arbitrary_yaml_text_resolves_or_raises_config_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deploy.yaml"
        path.write_text(text, encoding="utf-8")
        _resolves_or_config_error(deploy_config=path)


def test_self_referencing_yaml_alias_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text("extras: &a {k: *a}\n", encoding="utf-8")
    _resolves_or_config_error(deploy_config=path)
