"""Benchmarks of diffserve against diffusers on identical weights: end-to-end latency,
transformer step vs the machine's matmul peak, mp and HTTP overhead, throughput under
concurrent clients, cold start.

Run ``python -m benchmarks.run`` (full, writes benchmarks/RESULTS.md and
benchmarks/results.json) or ``python -m benchmarks.run --smoke --out
/tmp/bench/RESULTS.md`` (CI: tiny model, a couple of iterations).
"""
