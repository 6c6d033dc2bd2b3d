# Two commands do all set-up on a fresh machine:
#   make run   — install, then open the Streamlit app on the bundled MovieLens sample
#                (on 127.0.0.1; `ZEROGR_HOST=0.0.0.0 make run` opens it to the network)
#   make test  — install (with Debian's chromium for the browser test), then the full suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# With an NVIDIA GPU take the CUDA build that the GPU suite ran on (torch 2.11 brings
# triton 3.6); without one, the CPU wheel (torch 2.13.0 is on disk on the dev machines).
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_GPU),1)
TORCH_SPEC := torch==2.11.0
else
TORCH_SPEC := torch==2.13.0 triton==3.6.0
endif
PORT ?= 8501
# The app listens on this machine only; ZEROGR_HOST=0.0.0.0 (or one interface's address) opens it
# to the network: see "The app on a shared machine" in docs/app.md for what that exposes.
ZEROGR_HOST ?= 127.0.0.1
# pytest-xdist workers of `make test` (auto: one per core; the suite is CPU-bound, mostly
# kernels in Triton's interpreter, and took 31 minutes on one core of a 2-core machine)
TEST_WORKERS ?= auto

.PHONY: install run test test-gpu browser clean

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

install: $(STAMP)

browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the end-to-end test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

run: install
	$(PY) -m streamlit run app.py --server.address $(ZEROGR_HOST) --server.port $(PORT) --server.headless true \
	  --browser.gatherUsageStats false

test: install browser
	$(PY) -m pytest -n $(TEST_WORKERS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis test-artifacts
