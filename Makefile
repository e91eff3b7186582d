# Two entry points, each self-installing: `make sweep` (the main job) and `make test`.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

.PHONY: install sweep test
install: $(STAMP)

sweep: $(STAMP)
	$(VENV)/bin/jaxsched sweep -o results/demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -v -n 2 --dist worksteal tests
