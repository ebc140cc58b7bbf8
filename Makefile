# topicwire: the two commands a user needs are `make demo` and `make test`.
# Both do all set-up on a fresh Debian 12 machine (run as root): Debian packages, a venv in
# .venv and an editable install of the project with its dev extras. Re-runs are quick: each
# step is skipped when its stamp is newer than what it depends on.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
APT_PACKAGES := python3-venv python3-dev gcc make iproute2 tcpdump nftables iptables sockperf
APT_STAMP   := $(VENV)/.apt-stamp
PIP_STAMP   := $(VENV)/.pip-stamp
PYTEST_ARGS ?=

.PHONY: setup demo test lint unit clean

setup: $(PIP_STAMP)

$(APT_STAMP): Makefile
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make: installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

$(PY): | $(APT_STAMP)
	$(PYTHON) -m venv $(VENV)

$(PIP_STAMP): pyproject.toml $(APT_STAMP) | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

demo: setup
	$(VENV)/bin/topicwire demo

lint: setup
	$(VENV)/bin/ruff check .

unit: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test: lint unit

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
