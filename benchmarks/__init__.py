"""Benchmarks of diffserve against diffusers on identical weights (GitHub issue 7).

Run ``python -m benchmarks.run`` (full, writes benchmarks/RESULTS.md and benchmarks/results.json) or
``python -m benchmarks.run --smoke --out /tmp/bench/RESULTS.md`` (CI: tiny model, a couple of iterations).
"""
