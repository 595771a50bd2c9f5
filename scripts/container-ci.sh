#!/usr/bin/env bash
# Build the Docker image and run the tests inside it, with podman, on a machine that has no
# Docker engine and reaches no container registry (only PyPI and the Debian mirror):
#
#   1. podman, buildah, runc, debootstrap and iptables from the Debian packages (when missing);
#   2. a base image made locally with `debootstrap --variant=minbase bookworm` from the Debian
#      mirror apt already uses, imported as localhost/debian:bookworm-slim (once; reused);
#   3. the CPU torch wheel put in docker/wheels/ (ignored by git) for the build's bind mount;
#   4. `make docker-build` with podman: the unchanged Dockerfile, the host CA bundle as the build
#      secret `ca`, layers cached between runs;
#   5. `make docker-test` with ../shared mounted read-only: the tests inside the image.
#
# Idempotent: a rerun reuses the base image, the wheel and the build cache.
# Rootful: apt, debootstrap and podman's system storage need root; a non-root caller is re-run
# through `sudo -n` when that works, and stopped with one line otherwise. One run at a time per
# machine (a lock); any failure exits non-zero with a FAILED line naming the step.
# Environment: TESTS (pytest arguments; default "-m container tests --ignore=tests/vllm": the
# tests marked `container`, what can differ inside a container: the sandbox's isolation modes,
# permissions, the installed package, a short training and eval run; the host stage of .ci/run
# runs the whole suite), IMAGE, BASE_IMAGE, DEBIAN_MIRROR (default:
# the Debian mirror apt uses), CA_BUNDLE, TORCH_SPEC, SHARED, CONTAINER_RUN_FLAGS (extra
# `podman run` flags), TEST_TIMEOUT_S (default 3600), MIN_FREE_GB (default 6), BUILD_ONLY (1: stop
# once the image is built; .ci/run builds it that way while `make test` runs).
set -euo pipefail
# debootstrap, iptables and friends live in sbin, which a CI runner's PATH may lack.
export PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
cd "$(dirname "$0")/.."
REPO=$PWD
VARS=(TESTS IMAGE BASE_IMAGE SUITE DEBIAN_MIRROR CA_BUNDLE TORCH_SPEC SHARED CONTAINER_RUN_FLAGS
    CONTAINERS_CONF TEST_TIMEOUT_S MIN_FREE_GB BUILD_ONLY)

if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        echo "[container-ci] not root: re-running through sudo -n" >&2
        pass=()
        for v in "${VARS[@]}" $(compgen -e | grep -E '^(PIP_|(http|https|no)_proxy$|(HTTP|HTTPS|NO)_PROXY$)'); do
            [ -n "${!v+set}" ] && pass+=("$v=${!v}")
        done
        exec sudo -n env "PATH=$PATH" "${pass[@]}" "$REPO/scripts/container-ci.sh" "$@"
    fi
    echo "container-ci: FAILED: needs root (apt, debootstrap and rootful podman); run it as root" \
        "or give this user passwordless sudo" >&2
    exit 1
fi

IMAGE=${IMAGE:-localhost/gspo-cli:ci}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian:bookworm-slim}
SUITE=${SUITE:-bookworm}
# The mirror apt uses for Debian itself (deb822 or one-line sources), else deb.debian.org.
apt_mirror() {
    { grep -hs -E '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
      grep -hs -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
          | sed -E 's/\[[^]]*\] //' | awk '{print $2}'
    } | grep -E '/debian/?$' | head -1 | sed 's:/$::'
}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-$(apt_mirror || true)}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0+cpu}
SHARED=${SHARED:-$(cd "$REPO/.." && pwd)/shared}
TESTS=${TESTS:--m container tests --ignore=tests/vllm}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-3600}
MIN_FREE_GB=${MIN_FREE_GB:-6}
# bubblewrap inside the container (as the image's non-root user) must mount a fresh /proc, which
# the kernel refuses while podman masks paths under /proc; podman's default seccomp profile
# already allows the user namespace. See docs/docker.md (and Docker's flags).
CONTAINER_RUN_FLAGS=${CONTAINER_RUN_FLAGS:---security-opt unmask=/proc/*}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$REPO/docker/containers.conf}

STATE=$REPO/.container-ci
mkdir -p "$STATE"
T0=$(date +%s)
STEP="start"
TEST_CONTAINER="gspo-cli-ci-$$"
say() { printf '[container-ci %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
fail() { echo "container-ci: FAILED: $*" >&2; exit 1; }
finish() {
    local rc=$?
    # A killed or timed-out run leaves no test container behind (pytest is the container's pid 1
    # and ignores a forwarded SIGTERM).
    if type -P podman >/dev/null && podman container exists "$TEST_CONTAINER" 2>/dev/null; then
        podman rm -f -t 0 "$TEST_CONTAINER" >/dev/null 2>&1 || true
    fi
    if [ "$rc" != 0 ]; then
        echo "container-ci: FAILED (exit $rc) in step: $STEP, after $(($(date +%s) - T0)) s" \
            "(logs in $STATE/)" >&2
    fi
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# One run at a time on this machine: two runs at once would tag the same image (one could test
# the other's) and starve a small machine. Nothing started from here keeps the lock's descriptor
# (conmon outlives podman), so the lock ends with this script, killed or not.
STEP="waiting for another container-ci run"
LOCK=/run/lock/gspo-cli-container-ci.lock
[ -d /run/lock ] || LOCK=/tmp/gspo-cli-container-ci.lock
exec 9> "$LOCK"
podman() { command podman "$@" 9>&-; }
make() { command make "$@" 9>&-; }
if ! flock -n 9; then
    say "another container-ci run holds $LOCK; waiting"
    flock 9
fi

# 1. Tools. iptables and the network plugins are only recommended by podman's packages, which an
# apt configured without recommends would skip; the build's RUN steps need the network.
STEP="installing tools"
PIP=()
if [ -x "$REPO/.venv/bin/python" ]; then
    PIP=("$REPO/.venv/bin/python" -m pip)
elif python3 -m pip --version >/dev/null 2>&1; then
    PIP=(python3 -m pip)
fi
need=()
# type -P, not command -v: podman and make are shell functions here (above), which command -v
# would report as present when the programs are missing.
for tool in podman:podman buildah:buildah runc:runc debootstrap:debootstrap iptables:iptables \
    make:make; do
    type -P "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
[ -d /usr/lib/cni ] || [ -x /usr/lib/podman/netavark ] || need+=(containernetworking-plugins)
((${#PIP[@]})) || need+=(python3-pip)
if ((${#need[@]})); then
    command -v apt-get >/dev/null 2>&1 \
        || fail "missing ${need[*]} and no apt-get to install them (a Debian host is expected)"
    say "installing ${need[*]} (apt)"
    apt-get update -qq || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" > "$STATE/apt.log" 2>&1 \
        || { tail -20 "$STATE/apt.log" >&2; fail "apt-get install ${need[*]} failed"; }
    ((${#PIP[@]})) || PIP=(python3 -m pip)
fi

# Room for the image (2.4 GB), its build layers and the base image: podman's storage.
STEP="checking disk space"
store=/var/lib/containers
while [ ! -d "$store" ]; do store=$(dirname "$store"); done
free_gb=$(($(df -Pk "$store" | awk 'NR == 2 {print $4}') / 1024 / 1024))
((free_gb >= MIN_FREE_GB)) \
    || fail "only $free_gb GB free under $store; the build needs $MIN_FREE_GB (MIN_FREE_GB)." \
        "Old images: podman images; podman image prune"

# 2. The base image.
STEP="making the base image"
if podman image exists "$BASE_IMAGE"; then
    say "base image $BASE_IMAGE present"
else
    say "making $BASE_IMAGE with debootstrap ($SUITE, $DEBIAN_MIRROR)"
    root=$STATE/rootfs
    rm -rf "$root"
    debootstrap --variant=minbase "$SUITE" "$root" "$DEBIAN_MIRROR" > "$STATE/debootstrap.log" 2>&1 \
        || { tail -20 "$STATE/debootstrap.log" >&2; fail "debootstrap $SUITE from $DEBIAN_MIRROR"; }
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

# 3. The torch wheel for the build's bind mount: through pip's configured indexes and links
# first, else from the PyTorch CPU index (where the +cpu builds live; PyPI has none).
STEP="fetching the torch wheel"
if ! compgen -G "docker/wheels/torch-*.whl" > /dev/null; then
    say "fetching the $TORCH_SPEC wheel into docker/wheels/ (${PIP[*]})"
    wheel=(download --quiet --no-deps --only-binary=:all: --python-version 3.11
        --platform manylinux_2_28_x86_64 --dest docker/wheels "$TORCH_SPEC")
    "${PIP[@]}" "${wheel[@]}" 2> "$STATE/pip.log" \
        || "${PIP[@]}" "${wheel[@]}" --extra-index-url https://download.pytorch.org/whl/cpu \
            2>> "$STATE/pip.log" \
        || { tail -20 "$STATE/pip.log" >&2; fail "pip could not fetch $TORCH_SPEC"; }
fi

# 4. Build: the unchanged Dockerfile. podman needs the docker format for SHELL; the torch wheel
# comes from docker/wheels (so the torch index is plain PyPI here), the CA bundle is a secret.
flags="--pull=never --layers --format docker --build-arg BASE_IMAGE=$BASE_IMAGE"
flags+=" --build-arg TORCH_SPEC=$TORCH_SPEC --build-arg TORCH_INDEX_URL=https://pypi.org/simple"
[ -s "$CA_BUNDLE" ] && flags+=" --secret id=ca,src=$CA_BUNDLE"
STEP="building the image"
say "building $IMAGE"
t=$(date +%s)
make --no-print-directory docker-build DOCKER=podman IMAGE="$IMAGE" DOCKER_BUILD_FLAGS="$flags" \
    > "$STATE/build.log" 2>&1 || { tail -40 "$STATE/build.log" >&2; fail "image build"; }
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
say "built $IMAGE in $(($(date +%s) - t)) s, $((size / 1000000)) MB (log: .container-ci/build.log)"
if [ "${BUILD_ONLY:-0}" = 1 ]; then
    STEP="done"
    say "BUILD_ONLY=1: the image is built; no tests"
    exit 0
fi

# What the image says about the code sandbox with these flags.
STEP="asking the image for its sandbox modes"
# shellcheck disable=SC2086
podman run --rm $CONTAINER_RUN_FLAGS --entrypoint python "$IMAGE" -c \
    'from gspo_cli.sandbox import isolation as i; print("sandbox modes that work here:", ", ".join(i.available_modes()))' \
    2>&1 | sed 's/^/[container-ci] /'

# 5. Test (make docker-test rebuilds first: every layer comes from the cache). The container is
# named so that a failed or interrupted run removes it (see finish), and podman kills it after
# TEST_TIMEOUT_S whatever happens to this script.
STEP="testing in the container"
if [ -d "$SHARED" ]; then
    say "testing in $IMAGE: pytest $TESTS ($SHARED read-only; at most $TEST_TIMEOUT_S s)"
else
    say "testing in $IMAGE: pytest $TESTS (no $SHARED: the tests that need it skip)"
fi
t=$(date +%s)
rc=0
make --no-print-directory docker-test DOCKER=podman IMAGE="$IMAGE" DOCKER_BUILD_FLAGS="$flags" \
    SHARED="$SHARED" DOCKER_TEST_ARGS="$TESTS" \
    DOCKER_RUN_FLAGS="$CONTAINER_RUN_FLAGS --name $TEST_CONTAINER --timeout $TEST_TIMEOUT_S" \
    2>&1 | grep --line-buffered -v -E '^(STEP [0-9]|--> |COMMIT|Successfully tagged|[0-9a-f]{64}$)' \
    || rc=$?
if [ "$rc" != 0 ]; then
    (($(date +%s) - t < TEST_TIMEOUT_S)) \
        || fail "the tests in the container ran past TEST_TIMEOUT_S=$TEST_TIMEOUT_S s (killed)"
    fail "the tests in the container failed (exit $rc; pytest's summary above)"
fi
STEP="done"
say "tests passed in the container in $(($(date +%s) - t)) s; total $(($(date +%s) - T0)) s"
