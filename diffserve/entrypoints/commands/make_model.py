"""``diffserve make-model KIND DIR``: write one of the zoo's test and demo models and
print where. The kinds, their help and their builders live in
``diffserve/zoo/make_model.py`` (the zoo names model families; serving code does
not)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from diffserve.zoo.make_model import add_parser

    add_parser(subparsers).set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from diffserve.zoo.make_model import make

    print(make(args))
    return 0
