# Everything a fresh machine needs: `make test` and `make demo` create .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv tools lint test test-unit demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# The gcloud Firestore and Pub/Sub emulators and Java: says exactly what to install if missing.
tools: venv
	$(BIN)/python -c "from tpujobs.dev.processes import require_gcloud_emulators as r; r()"

lint: venv
	$(BIN)/ruff check shared functions tests bench

test-unit: venv
	$(BIN)/pytest tests/unit -q

# Every test: unit, emulator (Firestore, Pub/Sub, TPU simulator) and end to end (the local stack).
test: venv tools lint
	$(BIN)/pytest -q

demo: venv tools
	$(BIN)/tpujobs demo

bench: venv tools
	$(BIN)/python bench/submit.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .tpujobs
