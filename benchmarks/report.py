"""Writes RESULTS.md (machine, models, one table per measurement, the targets table) and
the JSON twin."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.section import Section
from benchmarks.settings import (
    GUIDANCE_SCALE,
    MAX_SEQUENCE_LENGTH,
    PROMPT,
    SEED,
    Settings,
)
from benchmarks.targets import Target

COMMAND = "python -m benchmarks.run"


def json_path(md_path: Path) -> Path:
    """results.json beside RESULTS.md; <stem>.json beside any other name."""
    md_path = Path(md_path)
    name = "results.json" if md_path.name == "RESULTS.md" else f"{md_path.stem}.json"
    return md_path.with_name(name)


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def write_json(
    path: Path,
    info: dict[str, Any],
    models: dict[str, Any],
    settings: Settings,
    sections: list[Section],
    targets: list[Target],
    total_s: float,
    *,
    generated: str | None = None,
) -> None:
    data = {
        "generated": generated or _now(),
        "mode": "smoke" if settings.smoke else "full",
        "total_s": round(total_s, 1),
        "machine": info,
        "models": models,
        "settings": asdict(settings),
        "sections": [s.to_json() for s in sections],
        "targets": [t.to_json() for t in targets],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def _other_kinds(path: Path, info: dict[str, Any]) -> list[str]:
    """Links to the reports beside this one that were measured on another CPU capability
    (each kind keeps its own file: one never overwrites the other)."""
    lines = []
    for other in sorted(Path(path).parent.glob("RESULTS*.md")):
        twin = json_path(other)
        if other.name == Path(path).name or not twin.exists():
            continue
        try:
            data = json.loads(twin.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        capability = data.get("machine", {}).get("cpu_capability")
        # Not a CPU run (RESULTS-GPU.md: benchmarks/gpu.py's own report)
        if capability is None:
            lines.append(
                f"- [{other.name}]({other.name}): the GPU benchmark "
                "(benchmarks/gpu.py)."
            )
            continue
        if capability == info.get("cpu_capability"):
            continue
        titles = ", ".join(
            s["title"].split(".", 1)[0] for s in data.get("sections", [])
        )
        lines.append(
            f"- [{other.name}]({other.name}): measured on a CPU "
            f"of kind {capability} ({data.get('mode')} "
            f"run, sections {titles})."
        )
    return ["Reports of other machine kinds:", "", *lines, ""] if lines else []


def write_markdown(
    path: Path,
    info: dict[str, Any],
    models: dict[str, Any],
    settings: Settings,
    sections: list[Section],
    targets: list[Target],
    total_s: float,
    *,
    generated: str | None = None,
) -> None:
    mode = (
        "smoke (CI: tiny model, a couple of iterations; numbers are not meaningful)"
        if settings.smoke
        else "full"
    )
    lines = [
        "# diffserve benchmarks vs diffusers (identical weights, same run)",
        "",
        f"Generated {generated or _now()} "
        f"by `{COMMAND}{' --smoke' if settings.smoke else ''}`"
        f" in {total_s:.0f} s; mode: {mode}.",
        "",
        "Every latency is the median over repeated runs after "
        "warm-up, contenders interleaved (A B, B A, ...)"
        " in one process so machine drift lands on all of them; "
        "`spread ±` is (max - min) / 2 / median."
        f" Every request: prompt {PROMPT!r}, seed {SEED}, guidance_scale "
        f"{GUIDANCE_SCALE},"
        f" max_sequence_length {MAX_SEQUENCE_LENGTH} unless a section says otherwise;"
        f" torch threads = {info.get('torch_threads')} for every contender.",
        "",
        *_other_kinds(path, info),
        "## Targets",
        "",
        *_table(
            ["target", "goal", "measured", "status", "note"],
            [
                [t.name, t.target, t.measured, _status(t.status), t.note]
                for t in targets
            ],
        ),
        "",
        "## Machine",
        "",
        *_table(["key", "value"], [[k, v] for k, v in info.items()]),
        "",
        "## Models",
        "",
        "Built with `diffserve.zoo.flux.build_flux_model(kind, "
        "dir, seed=0)`; both engines load the same "
        "directory.",
        "",
        *_table(
            ["model", *next(iter(models.values()), {}).keys()],
            [[name, *facts.values()] for name, facts in models.items()],
        ),
        "",
    ]
    for section in sections:
        lines += [f"## {section.title}", ""]
        if section.status != "ok":
            lines += [f"**{section.status}**: {section.reason}", ""]
        lines += [f"- {note}" for note in section.notes]
        if section.notes:
            lines.append("")
        if section.rows:
            lines += [*_table(section.columns, section.rows), ""]
        lines += [f"_{section.seconds:.0f} s_", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")


def _status(status: str) -> str:
    return {"met": "**met**", "missed": "**missed**"}.get(status, status)


def _table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            value = f"{value:.4g}"
        return str(value).replace("|", "\\|").replace("\n", " ")

    width = max([len(columns), *(len(r) for r in rows)]) if rows or columns else 0
    header = [*columns, *[""] * (width - len(columns))]
    out = ["| " + " | ".join(cell(c) for c in header) + " |", "|" + "---|" * width]
    out += [
        "| " + " | ".join(cell(v) for v in [*row, *[""] * (width - len(row))]) + " |"
        for row in rows
    ]
    return out
