# topicwire: the two commands a user needs are `make demo` and `make test`.
# Both do all set-up on a fresh Debian 12 machine (run as root): Debian packages, a venv in
# .venv and an editable install of the project with its dev extras (tshark: the tests run the
# Wireshark dissector with it; dumpcap is not made setuid; dpkg-dev: dpkg-source unpacks
# mosquitto's source package, whose conformance vectors tests/edge/mosquitto_vectors.py
# runs). Re-runs are quick: each step is skipped when its stamp is newer than what it
# depends on.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
APT_PACKAGES := python3-venv python3-dev gcc make iproute2 tcpdump nftables iptables sockperf \
                qemu-system-x86 kmod busybox-static rdma-core ibverbs-providers ibverbs-utils \
                libibverbs-dev python3-pyverbs perftest stress-ng mosquitto mosquitto-clients libmosquitto-dev \
                tshark openssl dpkg-dev mmdebstrap qemu-utils mtools dosfstools ovmf
APT_STAMP   := $(VENV)/.apt-stamp
PIP_STAMP   := $(VENV)/.pip-stamp
# Debian's python3-pyverbs (built for rdma-core's libibverbs; PyPI's does not load against it),
# and only it, made importable in the venv: a .pth naming a folder with a link to the package.
PYVERBS_DIR := /usr/lib/python3/dist-packages/pyverbs
PYVERBS_STAMP := $(VENV)/.pyverbs-stamp
PYTEST_ARGS ?=
FUZZ_SECONDS ?= 60

.PHONY: setup demo demo-cold test lint unit soak hwtest hwtest-images image bench-rdma fuzz clean

# The last step compiles every numba kernel with real traffic into the cache appliances load at
# start (`topicwire warm`; a no-op until a kernel source changes): no first run compiles live.
setup: $(PIP_STAMP) $(PYVERBS_STAMP)
	$(VENV)/bin/topicwire warm

$(APT_STAMP): Makefile
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "make: installing Debian packages:$$missing"; \
	  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

$(PY): | $(APT_STAMP)
	$(PYTHON) -m venv $(VENV)

$(PIP_STAMP): pyproject.toml $(APT_STAMP) | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

$(PYVERBS_STAMP): $(APT_STAMP) | $(PY)
	@test -d $(PYVERBS_DIR) || { echo "make: $(PYVERBS_DIR) is missing (python3-pyverbs)"; exit 1; }
	@mkdir -p $(VENV)/debian-pyverbs && ln -sfn $(PYVERBS_DIR) $(VENV)/debian-pyverbs/pyverbs
	@$(PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_path("purelib"), "debian-pyverbs.pth").write_text(str(pathlib.Path(sys.argv[1]).resolve()) + "\n")' $(VENV)/debian-pyverbs
	$(PY) -c 'import pyverbs.device; print("make: pyverbs importable from the venv")'
	@touch $@

demo: setup
	$(VENV)/bin/topicwire demo

# The first run on a new machine: every numba cache removed, then `make demo` (CI runs it).
demo-cold: $(PIP_STAMP) $(PYVERBS_STAMP)
	rm -rf $(VENV)/var/cache/topicwire-numba
	find . -name '*.nbi' -o -name '*.nbc' | xargs rm -f
	$(MAKE) demo

lint: setup
	$(VENV)/bin/ruff check .

# The 30 slowest tests are listed at the end (where the suite's time goes).
unit: setup
	$(PY) -m pytest --durations=30 $(PYTEST_ARGS)

# `make unit` 5 times, then twice with both cores busy (stress-ng): the suite must not flake.
soak: setup
	$(PY) tests/soak.py

# Hostile input (tests/fuzz): mutated frames at a live appliance's client and fabric ports,
# FUZZ_SECONDS at each, after mutated inputs through every decoder for FUZZ_SECONDS. Both run,
# the live one last (its one-line verdict ends the output), and it fails if either found a
# crash or an unaccounted frame (saved in tests/fuzz/corpus).
fuzz: setup
	@status=0; \
	$(PY) -m tests.fuzz decoders --seconds $(FUZZ_SECONDS) || status=1; \
	$(PY) -m tests.fuzz live --seconds $(FUZZ_SECONDS) || status=1; \
	exit $$status

# RDMA hardware tests: here if this machine has an RDMA device, else in a soft-RoCE QEMU guest
# (hwtests/guest/launch.py; downloads a Debian kernel and virtme-ng the first time); then the
# appliance image tests here on the host (hwtests/images: builds the image the first time).
hwtest: setup
	$(PY) -m hwtests.guest.launch test

# Appliance disk images (docs/images.md), as root: one image serves every role (the config disk
# says which); each build bakes in one role's default config. The root filesystem is cached in
# $(IMAGE_DIR)/.build by a digest of what goes in: the second role, or a rebuild after no
# source change, only remakes the ext4 and qcow2 (seconds).
IMAGE_DIR ?= $(VENV)/image
image: $(PIP_STAMP)
	$(VENV)/bin/topicwire image build --role core --out $(IMAGE_DIR)
	$(VENV)/bin/topicwire image build --role edge --out $(IMAGE_DIR)

# Only the appliance image tests (make hwtest runs them after the RDMA tests), on this host.
hwtest-images: setup
	$(PY) -m hwtests.guest.launch images

# RDMA channel benchmark beside perftest's ib_send_lat/ib_send_bw, in the same guest session.
bench-rdma: setup
	$(PY) -m hwtests.guest.launch bench

test: lint unit hwtest

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
