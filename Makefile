# Everything a fresh machine needs: `make test` and `make demo` create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# checkov pins dozens of packages of its own: it gets a venv of its own.
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-stamp
CHECKOV_VERSION := 3.3.30
TERRAFORM ?= terraform
TF_STATE_BUCKET ?=
TF_VARS_FILE ?=

.PHONY: venv tools emulator-tools container-tools browser-tools docker-engine terraform-tool lint docs test test-unit test-emulator demo bench clean bundle infra-check infra-fmt infra-test checkov plan apply

# The functions' pinned runtime dependencies are the constraints: tests run what deploys. The jax
# extra is examples/jax_lm's (JAX, Flax, optax, orbax), which its tests and the drill's run.
$(STAMP): pyproject.toml functions/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,jax]' -c functions/requirements.txt
	touch $(STAMP)

venv: $(STAMP)

# The gcloud Firestore and Pub/Sub emulators and Java: says exactly what to install if missing.
# Docker Engine, a registry and a static busybox (container-tools). And Terraform, for the infra
# checks (`terraform fmt`; no provider is downloaded).
tools: venv emulator-tools container-tools browser-tools terraform-tool

emulator-tools: venv
	$(BIN)/python -c "from tpujobs.local.processes import require_gcloud_emulators as r; r()"

# Jobs' images run on Docker Engine and are pulled from a registry on loopback; the image tests build
# from a static busybox. Debian's packages, installed with apt-get where missing when run as root (CI
# is); otherwise it names what to install and fails. A machine that has them all does nothing.
# Docker Engine answering before the tests, started (as root) and left running like the machine
# service it is, so that no test worker's teardown stops it under the other.
docker-engine: venv container-tools
	$(BIN)/python -m tpujobs.local.containers

container-tools:
	@missing=""; \
	{ command -v docker && command -v dockerd; } >/dev/null 2>&1 || missing="$$missing docker.io"; \
	command -v docker-registry >/dev/null 2>&1 || missing="$$missing docker-registry"; \
	{ [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; } || missing="$$missing busybox-static"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "missing:$$missing (Docker Engine, its registry, a static busybox); as root: apt-get install$$missing"; \
		exit 1; \
	fi; \
	echo "installing$$missing"; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing

# The dashboard's tests load its pages in a real browser: Debian's chromium, headless. Installed with
# apt-get where missing when run as root (CI is); otherwise the browser tests skip, saying so.
browser-tools:
	@command -v chromium >/dev/null 2>&1 && exit 0; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "chromium is missing: the dashboard's browser tests will skip (as root: apt-get install chromium)"; \
		exit 0; \
	fi; \
	echo "installing chromium"; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium

terraform-tool:
	@command -v $(TERRAFORM) >/dev/null || { echo "terraform is missing: install Terraform 1.5 or newer (one binary, e.g. in /usr/local/bin) or run make with TERRAFORM=/path/to/terraform"; exit 1; }

# ruff's lint rules (E501 at 120 columns included) and its formatter, which must have nothing to change;
# the layers of shared/tpujobs ([tool.importlinter] in pyproject.toml says which may import which); and
# mypy on shared/tpujobs and functions/main.py, strict on the domain, ports, service and reconciler
# ([tool.mypy] in pyproject.toml).
lint: venv
	$(BIN)/ruff check shared functions tests bench tools examples
	$(BIN)/ruff format --check shared functions tests bench tools examples
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

# The docs site (mkdocs.yml, docs/) into site/: --strict turns every warning (a broken link or anchor,
# a page outside the nav: mkdocs.yml's validation) into a failure. Never --quiet (it drops the warnings
# before strict mode counts them) nor --verbose (mkdocs 1.6 then skips the anchor checks):
# tests/unit/repo/test_checks_fail_on_faults.py runs this line on a planted broken anchor. Offline: no
# plugin fetches anything at build time.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test-unit: venv
	$(BIN)/pytest tests/unit tests/contract -m "not emulator" -q

test-emulator: venv emulator-tools
	$(BIN)/pytest -q -m "emulator or e2e"

# Every test: unit, emulator (Firestore, Pub/Sub, TPU simulator) and end to end (the local stack),
# after the infra checks. pytest-xdist workers, each with emulators of its own; each group of
# end-to-end tests goes whole to one worker with a local stack of its own (tests/conftest.py). The
# e2e tests mostly wait on the stack, so one worker more than this machine's 2 cores keeps them busy.
PYTEST_WORKERS ?= 3
test: venv tools lint docs infra-check docker-engine
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadgroup --durations=20

# Checks of infra/ that need no cloud and no provider download: formatting, checkov (zero failed
# checks; skips explained in place) and tests/infra (Terraform against the code, and against the
# schema of the Google provider infra/versions.tf pins, 6.50.0, from the package
# @cdktf/provider-google 16.12.1, reduced and kept in tests/data/provider-google).
# Two halves, so that each can run where its tools are (cloudbuild.yaml): infra-fmt needs only
# Terraform, infra-test only Python (.venv, .venv-checkov).
infra-check: infra-fmt infra-test

infra-fmt: terraform-tool
	$(TERRAFORM) fmt -check -recursive infra

infra-test: venv checkov
	BC_SKIP_MAPPING=TRUE CHECKOV_RUN_SCA_PACKAGE_SCAN_V2=false \
		$(CHECKOV_VENV)/bin/checkov --directory infra --framework terraform --skip-download --compact --quiet
	$(BIN)/pytest -q tests/infra

$(CHECKOV_STAMP):
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/pip install --quiet 'checkov==$(CHECKOV_VERSION)'
	touch $(CHECKOV_STAMP)

checkov: $(CHECKOV_STAMP)

# The deployable function source: dist/function/ and dist/function.zip (standard library only).
bundle:
	$(PYTHON) tools/bundle.py

# Deployment (needs credentials; `make bundle` first): TF_STATE_BUCKET names the state bucket, TF_VARS_FILE the
# variables (or set TF_VAR_project, TF_VAR_invokers, ...).
plan:
	$(TERRAFORM) -chdir=infra init -input=false -backend-config="bucket=$(TF_STATE_BUCKET)"
	$(TERRAFORM) -chdir=infra plan -input=false -out=tfplan $(if $(TF_VARS_FILE),-var-file=$(abspath $(TF_VARS_FILE)))

apply:
	$(TERRAFORM) -chdir=infra apply -input=false tfplan

demo: venv emulator-tools
	$(BIN)/tpujobs demo

bench: venv emulator-tools
	$(BIN)/python bench/submit.py

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis .tpujobs dist site
