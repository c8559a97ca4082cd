# Two commands: `make demo` and `make test`. Both create .venv at the repo root.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
OUT := out
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo test fuzz lint docs sample bench accuracy clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# The demo reads the sample W&B runs' .wandb logs: it installs the wandb extra.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[wandb]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[test]'
	touch $(VENV)/.installed $@

DEMO := $(BIN)/audit --db $(OUT)/demo.duckdb --config sample_logs/audit.toml

demo: $(VENV)/.installed
	@mkdir -p $(OUT)
	rm -f $(OUT)/demo.duckdb
	$(BIN)/python sample_logs/make_checkpoints.py $(OUT)/scratch
	$(DEMO) ingest mlflow --tracking-uri sample_logs/mlruns
	$(DEMO) ingest slurm sample_logs/slurm/week47.sacct
	$(DEMO) ingest gpu sample_logs/gpu/*.csv
	$(DEMO) ingest checkpoints $(OUT)/scratch
	$(DEMO) ingest wandb sample_logs/wandb
	$(DEMO) status
	$(DEMO) scan
	$(DEMO) report weekly --week 2026-W47 --output $(OUT)/weekly-2026-W47.html

test: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

# Property and fuzz tests with fresh random examples (make test replays a fixed set).
# Failures found here are kept in .hypothesis/ and tried first on the next run.
fuzz: $(VENV)/.installed-test
	AUDIT_HYPOTHESIS=explore $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/robustness/test_fuzz_parsers.py tests/robustness/test_fuzz_run_records.py \
		tests/robustness/test_prune_property.py tests/robustness/test_prune_sequences.py \
		tests/unit/test_search_property.py tests/robustness/test_search_safety.py \
		tests/importers/test_mlflow_change_proof.py \
		tests/unit/test_gpu_samples_store.py

# Precision and recall against the expert verdicts on ../shared/realdata (tests/accuracy/).
accuracy: $(VENV)/.installed-test
	$(BIN)/python -m tests.accuracy

lint: $(VENV)/.installed-test
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# Rewrites the documentation generated from the code: docs/cli.md (the commands' --help),
# docs/rules/ (one page per rule) and the generated blocks of docs/configuration.md and README.md.
docs: $(VENV)/.installed
	$(BIN)/python -m audit.docs

# Rewrites sample_logs/ from sample_logs/generate.py (needs the full mlflow: make test first).
sample: $(VENV)/.installed-test
	$(BIN)/python sample_logs/generate.py
	$(BIN)/python sample_logs/generate_cluster.py
	$(BIN)/python sample_logs/generate_wandb.py

# Benchmarks (docs/benchmarks.md; generated data is cached outside the repo, ~/.cache/audit-bench).
# SIZE=S|M|L; L needs ~20 GB of disk and ~45 min the first time (~25 min after).
SIZE ?= S
REPS ?= 5
bench: $(VENV)/.installed-test
	$(BIN)/python -m bench --size $(SIZE) --reps $(REPS)

clean:
	rm -rf $(VENV) $(OUT) build dist *.egg-info
