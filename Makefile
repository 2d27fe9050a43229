# Feed the GPU — the two commands a newcomer needs are `make lab` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PORT   ?= 8888
NB     ?= notebooks/*.ipynb
GRADE_FLAGS ?= --smoke

.PHONY: lab test unit browser browser-deps notebooks grade ladder course gpu-check student venv clean

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

## test: unit tests, `make lab` driven in headless Chromium, then every notebook headless in
## smoke mode (solutions pass, students fail).
test: $(STAMP) browser-deps
	COURSE_SMOKE=1 $(PY) -m pytest tests/unit -q
	COURSE_SMOKE=1 COURSE_CHROMIUM=$(CHROMIUM) $(PY) -m pytest tests/browser -q
	COURSE_SMOKE=1 $(PY) -m pytest tests/notebooks -q

unit: $(STAMP)
	COURSE_SMOKE=1 $(PY) -m pytest tests/unit -q

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

clean:
	rm -rf build .pytest_cache
