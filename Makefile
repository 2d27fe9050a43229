# Feed the GPU — the two commands a newcomer needs are `make lab` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HUB_STAMP := $(VENV)/.hub-installed
PORT   ?= 8888
NB     ?= notebooks/*.ipynb
GRADE_FLAGS ?= --smoke

.PHONY: lab test test-all unit unit-all browser browser-deps notebooks grade ladder course gpu-check student venv clean \
        hub hub-deps hub-clean collect

venv: $(STAMP)

# Create .venv when missing (or when the pinned versions change), install the pins and
# course_utils in editable mode.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# DALI moved to the cuda130 wheel (torch is built for CUDA 13): both install nvidia/dali, so the old one goes
	$(PY) -m pip uninstall -q -y nvidia-dali-cuda120 2>/dev/null || true
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

## lab: open the course in JupyterLab on 127.0.0.1 behind a fresh random token, passed to the
## server in its environment (never on its command line). A busy port stops it with the advice
## to use PORT=; the link is printed once the server answers. See course_utils/lab.py.
lab: $(STAMP)
	$(PY) -m course_utils.lab --port $(PORT) $(LAB_ARGS)

## test: unit tests, `make lab` driven in headless Chromium, `make hub` with two learners in it (as root;
## tests/hub), then every notebook headless in smoke mode (solutions pass, students fail).
test: $(STAMP) browser-deps hub-deps
	COURSE_SMOKE=1 $(PY) -m pytest tests/unit -q --durations=15
	COURSE_SMOKE=1 COURSE_CHROMIUM=$(CHROMIUM) $(PY) -m pytest tests/browser tests/hub -q --durations=5
	COURSE_SMOKE=1 $(PY) -m pytest tests/notebooks -q --durations=20

## test-all: the extended run, before a release (about twice `make test`): every mutant suite's answer on
## every seed, and the runs marked `extended` (tests/conftest.py: lessons 00/01/02/04 on the CPU device,
## lesson 04 at 16 faked cores, the GPU check's dry run, the timed busy-machine tests of 2.2 and 8.1)
test-all:
	COURSE_EXTENDED=1 COURSE_MUTANT_SEEDS=all $(MAKE) --no-print-directory test

unit: $(STAMP)
	COURSE_SMOKE=1 $(PY) -m pytest tests/unit -q

## unit-all: the unit tests with every answer of a mutant suite on every seed its test names (the extended
## run, before a release; `make test` runs each on two of them: tests/unit/mutants.py says which)
unit-all: $(STAMP)
	COURSE_SMOKE=1 COURSE_MUTANT_SEEDS=all $(PY) -m pytest tests/unit -q

browser: $(STAMP) browser-deps
	COURSE_SMOKE=1 COURSE_CHROMIUM=$(CHROMIUM) $(PY) -m pytest tests/browser -q

## browser-deps: Debian's Chromium for the browser test, installed when missing (as root, with
## apt-get; never a browser download). Elsewhere it says what to install and the test skips.
CHROMIUM ?= /usr/bin/chromium
browser-deps:
	@if [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing Debian's chromium and chromium-driver for the browser test (once)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver; \
	else \
	  echo "No Chromium at $(CHROMIUM): the browser test will be skipped. On Debian: sudo apt-get install chromium chromium-driver"; \
	fi

notebooks: $(STAMP)
	COURSE_SMOKE=1 $(PY) -m pytest tests/notebooks -q

## grade: grade notebooks headless, e.g. `make grade NB="submissions/*/01-*.ipynb" GRADE_FLAGS="--jobs 2"`
## (smoke by default; GRADE_FLAGS= for full size). Writes build/grades.json, build/gradebook.csv and
## the executed copies in build/graded/; fails only when the grader could not grade (exit 2 or 3) or was
## interrupted (130, 143: run it again to resume), not when a submission did not pass (see INSTRUCTORS.md).
grade: $(STAMP)
	$(PY) -m course_utils.grade $(NB) $(GRADE_FLAGS) --json build/grades.json --csv build/gradebook.csv \
	  --output-dir build/graded; status=$$?; [ $$status -le 1 ]

## ladder: climb the optimisation ladder on this machine (add ARGS=--smoke for a quick run).
ladder: $(STAMP)
	$(PY) -m course_utils.ladder $(ARGS) --json build/ladder.json

## course: every solution notebook at full size through the grader: executed copies in
## build/executed/, results in build/course.json and build/course.csv (all must pass).
course: $(STAMP)
	$(PY) -m course_utils.grade solutions/*.ipynb --notebook-timeout 7200 --output-dir build/executed \
	  --json build/course.json --csv build/course.csv

## gpu-check: the GPU run in one command (course_utils/gpu_check.py): the setup check, the GPU-marked
## tests, the ladder and every solution at full size through the grader, the README's open measurements,
## one report in build/gpu-check/. ARGS="--plan" (the stages and the calls that fit them),
## ARGS="--pending --budget 540" (what fits in 9 minutes, the folder accumulates), ARGS="--dry-run" (a CPU).
## It installs nothing: without .venv (an offline GPU box) it runs with $(PYTHON).
gpu-check:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m course_utils.gpu_check $(ARGS)

## student: regenerate notebooks/ from solutions/ (never edit notebooks/ by hand).
student: $(STAMP)
	$(PY) -m course_utils.authoring student

## hub: the workshop on JupyterHub (course_utils/hub, INSTRUCTORS.md "A workshop on JupyterHub"): one address
## for the room (127.0.0.1:$(HUB_PORT), HUB_IP=0.0.0.0 opens it), the learners of HUB_LEARNERS (names or a
## file) with the shared HUB_PASSWORD (generated and printed once when unset), HUB_ADMIN the admin; as root an
## account, cores, a memory cap and a GPU per learner. State in .hub/ (HUB_STATE). Ctrl-C stops it all.
## e.g. `sudo make hub HUB_LEARNERS=alice,bob HUB_ADMIN=teacher`
hub: hub-deps
	$(PY) -m course_utils.hub

## hub-deps: the hub's packages (hub/requirements.txt: JupyterHub, batchspawner) into .venv, and its proxy
## (configurable-http-proxy, pinned in hub/proxy/package-lock.json) from npm into .venv/hub-proxy. Without
## Node.js 20+ the proxy is left out: `make hub` says so and the hub test is skipped.
HUB_PROXY_STAMP := $(VENV)/hub-proxy/.installed
hub-deps: $(HUB_STAMP) $(HUB_PROXY_STAMP)
$(HUB_STAMP): $(STAMP) hub/requirements.txt
	$(PY) -m pip install -q -r hub/requirements.txt
	touch $@
$(HUB_PROXY_STAMP): hub/proxy/package.json hub/proxy/package-lock.json
	@if command -v npm >/dev/null 2>&1 && [ "$$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -ge 20 ]; then \
	  rm -rf $(VENV)/hub-proxy && mkdir -p $(VENV)/hub-proxy && \
	  cp hub/proxy/package.json hub/proxy/package-lock.json $(VENV)/hub-proxy/ && \
	  (cd $(VENV)/hub-proxy && npm ci --no-audit --no-fund --loglevel=error) && touch $@; \
	else \
	  echo "No Node.js 20+ with npm: the hub's proxy (configurable-http-proxy) is not installed; make hub needs it."; \
	fi

## hub-clean: remove the hub's state (.hub/: database, cookie secret, passwords); learners' homes are kept.
hub-clean:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m course_utils.hub --clean

## collect: `make collect LESSON=02`: each learner's copy of lesson 02 into submissions/<learner>/ (those
## with none are named and skipped), then graded (as the grader's own account when root), smoke by default
## (GRADE_FLAGS= for full size): build/grades-02.json, build/gradebook-02.csv, build/graded-02/.
SUBMISSIONS ?= submissions
collect: $(STAMP)
	@test -n "$(LESSON)" || { echo "say which lesson: make collect LESSON=02"; exit 2; }
	$(PY) -m course_utils.hub.collect --lesson $(LESSON) --submissions $(SUBMISSIONS) $(GRADE_FLAGS); \
	  status=$$?; [ $$status -le 1 ]

clean:
	rm -rf build .pytest_cache
