"""What signs an images-API response's files: the server's key (``server.provenance``,
server-wide like every ``server.*`` setting: the first model's config) and the facts of
the request and its output."""

from __future__ import annotations

from diffserve import __version__
from diffserve.config.server_schema import ServerConfig
from diffserve.entrypoints.openai.served import ServedModels
from diffserve.entrypoints.provenance_keys import signer_for
from diffserve.provenance.facts import from_output
from diffserve.provenance.keys import Signing
from diffserve.types.request import GenerationRequest, RequestOutput


def image_signing(
    models: ServedModels,
    requested: str | None,
    gen: GenerationRequest,
    output: RequestOutput,
) -> Signing | None:
    """None when the server's provenance is off."""
    config = models.first.config
    signer = signer_for(config.server if config is not None else ServerConfig())
    if signer is None:
        return None
    served = models.pick(requested, default_makes="images")
    generation = from_output(
        output,
        model=served.name,
        prompt=gen.prompt,
        seed=0,  # each image's own, set by encode_all
        negative_prompt=gen.negative_prompt,
        edit=bool(gen.images),
    )
    return Signing(signer, generation, __version__)
