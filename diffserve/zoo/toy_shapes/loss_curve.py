"""The training log's loss curves as a PNG (drawn with PIL: no matplotlib)."""

from __future__ import annotations

from pathlib import Path


def write_loss_curve(
    path: Path, vae_loss: list[float], transformer_loss: list[float]
) -> None:
    """The loss curves (log scale, smoothed) side by side as a PNG, drawn with PIL (no
    matplotlib); an empty one (the adapter trains no VAE) gets no panel."""
    import math

    from PIL import Image, ImageDraw

    panels = [
        (name, values)
        for name, values in (("vae", vae_loss), ("transformer", transformer_loss))
        if values
    ]
    width, height, pad = 320, 200, 24
    image = Image.new("RGB", (max(len(panels), 1) * width, height), "white")
    pen = ImageDraw.Draw(image)
    for panel, (name, values) in enumerate(panels):
        window = max(1, len(values) // 100)
        smooth = [
            sum(values[i : i + window]) / len(values[i : i + window])
            for i in range(0, len(values), window)
        ]
        logs = [math.log10(max(v, 1e-8)) for v in smooth]
        low, high = min(logs), max(logs)
        span = (high - low) or 1.0
        x0 = panel * width + pad
        points = [
            (
                x0 + (width - 2 * pad) * i / max(len(logs) - 1, 1),
                height - pad - (height - 2 * pad) * (v - low) / span,
            )
            for i, v in enumerate(logs)
        ]
        pen.rectangle((x0, pad, x0 + width - 2 * pad, height - pad), outline="grey")
        pen.line(points, fill="navy", width=2)
        pen.text(
            (x0, 4),
            f"{name} loss (log10 {low:.2f}..{high:.2f}), {len(values)} steps",
            fill="black",
        )
    image.save(path)
