# `make demo` and `make test` each set up everything on a fresh machine.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# uv installs the same pinned versions as pip (identical `pip freeze`, compared 2026-11-29) in seconds from its
# cache (~/.cache/uv) where pip took two minutes to unpack the same wheels on every clean clone.
# --compile-bytecode (what each command installs, once per install): uv leaves that to the first import,
# and where PYTHONDONTWRITEBYTECODE is set no import ever writes it, so every Python process compiled
# torch's and transformers' sources again: 12 of a trainer process's 26 s to its first step (measured).
UV     ?= uv==0.13.9
PIP    := $(VENV)/bin/uv pip
# PyPI's build (CUDA libraries as nvidia-* wheels; runs on CPU too), the same pin as the
# Dockerfile's TORCH. CONSTRAINTS pins the trainer stack to the versions the image ships.
TORCH  ?= torch==2.13.0
CONSTRAINTS := constraints.txt
STAMP  := $(VENV)/.installed

.PHONY: install bytecode demo test test-fast lint typecheck architecture generate verify bench bench-operator clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check "$(UV)"
	$(PIP) install --python $(PY) -c $(CONSTRAINTS) --compile-bytecode "$(TORCH)"
	$(PIP) install --python $(PY) -c $(CONSTRAINTS) --compile-bytecode -e '.[operator,trainer,deepspeed,s3,dev,export,tracking]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/rosetta run -f examples/quickstart.yaml --output runs/quickstart

# Two workers: the tests that share a cluster, the real node or the integration control plane run
# as one group each (tests/support/worker_groups.py, longest groups first) and mostly wait on
# controllers and containers while the other worker runs the rest. The slowest tests and a line per tier (tests/support/tier_times.py)
# end the report: where the time went (docs/testing.md). Three workers were slower on two cores
# (43.9 minutes of pytest against 27.8, measured): the controllers they wait on need the same cores.
test: bytecode
	$(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=25

test-fast: bytecode
	$(PY) -m pytest -n 2 --dist loadgroup --no-loadscope-reorder -m "not slow and not cluster"

# The repository's own modules as bytecode: the editable install leaves them as sources, and where
# PYTHONDONTWRITEBYTECODE is set every process compiled them again (0.13 s of a `rosetta validate`'s
# 0.96 s, profiled; a test run starts hundreds of trainers and CLIs). compileall skips what is current.
bytecode: install
	$(PY) -m compileall -q -j 0 contract cli operator trainer tests

# Style and import order (ruff), and the layers: the contract imports neither side, and the trainer and
# the operator do not import each other (import-linter; docs/architecture.md); no import cycle (imports
# inside functions too), no private name used across modules, no module over 450 lines.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q tests/unit/project/test_import_graph.py tests/unit/project/test_module_sizes.py

# mypy with pydantic's plugin, strict (pyproject.toml's overrides), over every package: the contract
# both sides build on, the operator, the trainer and the command line.
typecheck: install
	$(VENV)/bin/mypy -p rosetta_contract -p rosetta_operator -p rosetta_cli -p rosetta_trainer

# Files generated from the code: the CRD (from the spec models) and its copy in the chart, the
# chart's values schema and README (from values.yaml and its comments), the raw operator manifest
# (the chart rendered by Helm's engine), the core/v1 types the contract checks free-form pod fields
# against (from the Kubernetes client's models), the diagram in docs/architecture.md (make architecture).
# Run it after changing the spec or the chart, or adding a module; `make verify` fails when a commit left
# one of them stale.
GENERATED := manifests/crd.yaml charts/rosetta/files/crd.yaml charts/rosetta/values.schema.json manifests/operator.yaml \
	contract/rosetta_contract/core_types.json charts/rosetta/README.md docs/architecture.md

# The packages, their layers and modules, drawn from the import graph and pyproject.toml's layers
# contracts into docs/architecture.md's generated block (the rest of the page is left as it is).
architecture: install
	$(PY) scripts/architecture_diagram.py

generate: install architecture
	$(VENV)/bin/rosetta crd > manifests/crd.yaml
	cp manifests/crd.yaml charts/rosetta/files/crd.yaml
	$(PY) charts/values_schema.py > charts/rosetta/values.schema.json
	$(PY) charts/chart_readme.py > charts/rosetta/README.md
	$(PY) tests/support/chart.py > manifests/operator.yaml
	$(PY) -m rosetta_operator.core_types_table > contract/rosetta_contract/core_types.json

verify: generate
	@git diff --exit-code --stat -- $(GENERATED) || { echo "generated files were stale: commit what make generate wrote"; exit 1; }

# Rosetta against Hugging Face's Seq2SeqTrainer (docs/benchmarks.md); BENCH_ARGS="--steps 600 ..."
BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PIP) install --python $(PY) -c $(CONSTRAINTS) --compile-bytecode -e '.[operator,trainer,deepspeed,s3,dev,export,tracking,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) bench/hf_seq2seq.py $(BENCH_ARGS)

# The operator against a real control plane: N TranslationTrainings (docs/benchmarks.md, "Operator at scale").
# OPERATOR_BENCH_ARGS="--count 1000 --rate 20 --namespaces 1"
bench-operator: $(BENCH_STAMP)
	$(PY) bench/operator_scale.py $(OPERATOR_BENCH_ARGS)

clean:
	rm -rf $(VENV) runs build *.egg-info
