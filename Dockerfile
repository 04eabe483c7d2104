# diffserve in a container: `docker build -t diffserve .` (CPU), `docker build --build-arg BASE=cuda -t diffserve:cuda .`
# (CUDA). Installed the README way: the pinned torch first (an unpinned one pulls whatever build pip resolves), then
# the package with the server and video extras. Runs as a non-root user; Docker's health check asks /ready.
# docs/deploy.md has the Kubernetes Deployment and Service that run it.
ARG BASE=cpu
ARG PYTHON_IMAGE=python:3.11-slim
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${PYTHON_IMAGE} AS base-cpu
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM ${CUDA_IMAGE} AS base-cuda
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128

FROM base-${BASE}
ARG TORCH_VERSION=2.13.0
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --index-url ${TORCH_INDEX_URL} torch==${TORCH_VERSION}
WORKDIR /opt/diffserve
COPY pyproject.toml README.md ./
COPY diffserve ./diffserve
RUN /opt/venv/bin/pip install --no-cache-dir ".[server,video,otel]"
RUN useradd --create-home --uid 10001 diffserve
ENV PATH=/opt/venv/bin:${PATH} \
    HF_HOME=/home/diffserve/.cache/huggingface \
    XDG_STATE_HOME=/home/diffserve/.local/state
USER diffserve
WORKDIR /home/diffserve
EXPOSE 8000
# start-period: loading (and compiling) a model takes minutes; /ready answers 200 once every model serves
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=4).status != 200)"]
# Inside a container the server binds every interface (the container's network is the boundary); the default
# model is the shipped toy-shapes: pass a model directory or hub id (and flags) as the container's arguments.
ENTRYPOINT ["diffserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD []
