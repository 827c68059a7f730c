# The two commands in README.md: `make demo` (the main job) and `make test` (the whole suite).
# Everything they need is installed by them: a virtualenv with the pinned Python packages,
# and the pinned Go tools built from the Go module proxy into ~/.cache/pmem-csi-pulumi.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test unit lint mutate tools image cluster-start cluster-stop postgres-start \
	postgres-stop clean-state

# uv installs the pinned packages (README, "Dependencies"): the same wheels as pip, in about
# half pip's CPU time here; bytecode compiled at install, as pip does. uv reads UV_* settings,
# not pip's: the PIP_* ones set in the environment are passed on (pip.conf is not read).
UV_VERSION := 0.13.9
comma := ,
empty :=
space := $(empty) $(empty)
UV_ENV := $(if $(PIP_INDEX_URL),UV_INDEX_URL='$(PIP_INDEX_URL)') \
	$(if $(PIP_EXTRA_INDEX_URL),UV_EXTRA_INDEX_URL='$(PIP_EXTRA_INDEX_URL)') \
	$(if $(PIP_FIND_LINKS),UV_FIND_LINKS='$(subst $(space),$(comma),$(strip $(PIP_FIND_LINKS)))') \
	$(if $(PIP_DEFAULT_TIMEOUT),UV_HTTP_TIMEOUT='$(PIP_DEFAULT_TIMEOUT)') \
	$(if $(PIP_CERT),$(if $(SSL_CERT_FILE),,SSL_CERT_FILE='$(PIP_CERT)'))
UV_INSTALL := env $(strip $(UV_ENV)) $(VENV)/bin/uv pip install --python $(PY) -q \
	--compile-bytecode $(if $(filter 1 true yes on,$(PIP_NO_INDEX)),--no-index)

$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --disable-pip-version-check -q uv==$(UV_VERSION)
	$(UV_INSTALL) -r requirements-dev.txt
	# The project itself, editable and without dependencies (pinned above): this installs the
	# `pmem-csi-reporter` console script.
	$(UV_INSTALL) --no-deps -e .
	touch $@

tools: $(VENV)/.installed
	$(PY) -m tools.toolchain build

# The reporter's OCI image (layout + oci-archive) in ~/.cache/pmem-csi-pulumi/image, rebuilt
# only when its inputs change; installs mmdebstrap, umoci, skopeo and runc with apt-get when
# missing. See docs/reporter.md, "The reporter image".
image: $(VENV)/.installed
	$(PY) -m tools.image build

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit -q

# Mutation testing of the pure core against the unit tests (by hand, not part of `make test`;
# docs/testing.md): a fresh mutmut run in mutants/, then the score per module. Niced, since it
# keeps every core busy for a while.
mutate: $(VENV)/.installed
	nice -n 10 $(PY) -m tools.mutate run

# The whole suite: unit tests, then the end-to-end tests on a local cluster with the real
# Pulumi engine. PMEM_CSI_REQUIRE_CLUSTER makes a missing tool a failure, never a skip.
# TEST_WORKERS pytest-xdist workers, each with a cluster of its own; a test module runs whole on
# one worker, the tests that use the real node all on the same one (tests/conftest.py).
TEST_WORKERS ?= 3
test: $(VENV)/.installed lint tools image
	PMEM_CSI_REQUIRE_CLUSTER=1 $(PY) -m pytest tests -v -n $(TEST_WORKERS) --dist loadscope \
		--no-loadscope-reorder --timeout=900 --durations=15

demo: $(VENV)/.installed tools
	$(PY) -m tools.demo

cluster-start: $(VENV)/.installed
	$(PY) -m tools.cluster start

cluster-stop: $(VENV)/.installed
	$(PY) -m tools.cluster stop

# A local PostgreSQL server as a team's state backend (Debian's postgresql, installed with
# apt-get when missing); prints the `pulumi login` URL. See docs/configuration.md,
# "Choosing a state backend".
postgres-start: $(VENV)/.installed
	$(PY) -m tools.postgres start

postgres-stop: $(VENV)/.installed
	$(PY) -m tools.postgres stop

# Also the cluster a test session left running with PMEM_CSI_KEEP_CLUSTER=1.
clean-state: cluster-stop postgres-stop
	# A test session stopped half way (Ctrl-C, a timeout) leaves its clusters, including
	# test_one_cluster.py's second cluster, and the reporters it ran as local processes.
	state="$${PMEM_CSI_STATE_DIR:-.state}"; \
	for d in "$$state"/test-session "$$state"/test-session/gw* "$$state"/test-session/second-cluster \
		"$$state"/test-session/gw*/second-cluster; do \
		if [ -d "$$d" ]; then PMEM_CSI_STATE_DIR="$$d" $(PY) -m tools.cluster stop && \
			PMEM_CSI_STATE_DIR="$$d" $(PY) -m tools.postgres stop; fi; done; \
	if [ -d "$$state/test-session" ]; then \
		pkill -f -- "--kubeconfig $$(realpath "$$state")/test-session/" || true; fi
	rm -rf .state
