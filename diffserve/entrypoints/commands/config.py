"""``diffserve config explain|validate|schema``: show, check and describe the deploy
config.

None of these loads weights or starts a worker; ``explain`` and ``validate`` run the
same resolver the engine runs, so what they print is what a worker would get.
"""

from __future__ import annotations

import argparse
import json
import sys

from diffserve.errors import ConfigError, ConfigErrors


def register(subparsers: argparse._SubParsersAction) -> None:
    from diffserve.config.cli_args import add_config_arguments

    parser = subparsers.add_parser(
        "config",
        help="explain, validate or describe the deploy config",
        description="Inspect the resolved deploy config without loading weights.",
    )
    actions = parser.add_subparsers(
        dest="config_action", metavar="ACTION", required=True
    )
    explain = actions.add_parser(
        "explain", help="every effective value of every stage, with its source"
    )
    validate = actions.add_parser(
        "validate", help="exit 0 if the config is valid, else print every problem"
    )
    for sub in (explain, validate):
        sub.add_argument(
            "model",
            nargs="?",
            default=None,
            metavar="MODEL",
            help="model directory (diffusers layout; only model_index.json is read)",
        )
        add_config_arguments(sub)
    explain.add_argument(
        "--json", action="store_true", help="print machine-readable JSON"
    )
    actions.add_parser("schema", help="print the JSON Schema of the deploy YAML")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.config_action == "schema":
        from diffserve.config.json_schema import deploy_json_schema

        print(json.dumps(deploy_json_schema(), indent=2))
        return 0

    from diffserve.config.cli_args import config_kwargs_from_args
    from diffserve.config.explain import explain_dict, render_table
    from diffserve.config.resolve import resolve

    try:
        resolved = resolve(model=args.model, **config_kwargs_from_args(args))
    except ConfigError as exc:
        if args.config_action != "validate":
            raise
        problems = exc.errors if isinstance(exc, ConfigErrors) else [exc]
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        print(f"{len(problems)} problem(s) found", file=sys.stderr)
        return 1
    if args.config_action == "validate":
        for warning in resolved.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"ok: config is valid (fingerprint {resolved.fingerprint})")
        return 0
    if args.json:
        print(json.dumps(explain_dict(resolved), indent=2, default=repr))
    else:
        print(render_table(resolved))
    return 0
