# Feed the GPU — the two commands a newcomer needs are `make lab` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PORT   ?= 8888
NB     ?= notebooks/*.ipynb
GRADE_FLAGS ?= --smoke

.PHONY: lab test unit notebooks grade ladder course student venv clean

venv: $(STAMP)

# Create .venv when missing (or when the pinned versions change), install the pins and
# course_utils in editable mode.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

## lab: open the course in JupyterLab, on localhost only, behind a fresh random token.
## (As root, in a container say, Jupyter refuses to start without --allow-root: it is added
## only then; the server still listens on localhost only and still needs the token.)
lab: $(STAMP)
	@token=$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(24))'); \
	echo; echo "  Feed the GPU: open http://127.0.0.1:$(PORT)/lab?token=$$token"; echo; \
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.port=$(PORT) --ServerApp.port_retries=0 \
	  $$([ "$$(id -u)" = 0 ] && echo --allow-root) \
	  --ServerApp.root_dir=$(CURDIR) --IdentityProvider.token=$$token \
	  --ServerApp.default_url=/lab/tree/notebooks/00-welcome-and-setup.ipynb

## test: unit tests, then every notebook headless in smoke mode (solutions pass, students fail).
test: $(STAMP)
	COURSE_SMOKE=1 $(PY) -m pytest tests/unit -q
	COURSE_SMOKE=1 $(PY) -m pytest tests/notebooks -q

unit: $(STAMP)
	COURSE_SMOKE=1 $(PY) -m pytest tests/unit -q

notebooks: $(STAMP)
	COURSE_SMOKE=1 $(PY) -m pytest tests/notebooks -q

## grade: grade notebooks headless, e.g. `make grade NB="submissions/*/01-*.ipynb" GRADE_FLAGS="--jobs 2"`
## (smoke by default; GRADE_FLAGS= for full size). Writes build/grades.json, build/gradebook.csv and
## the executed copies in build/graded/; fails only when the grader could not grade (exit 2 or 3),
## not when a submission did not pass (see INSTRUCTORS.md).
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

## student: regenerate notebooks/ from solutions/ (never edit notebooks/ by hand).
student: $(STAMP)
	$(PY) -m course_utils.authoring student

clean:
	rm -rf build .pytest_cache
