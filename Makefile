# One entry point for people and CI. `make demo` runs the main job; `make test` is what CI runs.
VENV      ?= .venv
PY        := $(VENV)/bin/python
PIP       := $(PY) -m pip
TORCH     ?= torch==2.14.1
FBGEMM    ?= fbgemm-gpu-cpu==1.9.0
TORCHREC  ?= torchrec==1.9.2
RECBOLE   ?= recbole==1.2.1
RAY       ?= ray[serve]==2.60.0
PYTRITON  ?= nvidia-pytriton==0.7.0
# tritonclient's gRPC side pins protobuf < 7: the grpc family at the last release built for it
GRPC      ?= 1.81.1
DEMO_STORE ?= bench/scratch/demo-rmc1
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: demo test test-slow develop build-deps system-deps rust-check py-check docs bench bench-quick wheel wheel-smoke fuzz clean

# The environment: a virtualenv with the build tool, test tools, PyTorch (CPU use of the default
# wheel), FBGEMM's CPU build and TorchRec (the peers, and the KeyedJaggedTensor tests), RocksDB
# through rocksdict (`bench update`'s peer), grpcio with its health and reflection clients (stock
# clients of the storage node), prometheus-client (its parser reads the node's metrics), Ray and
# Ray Serve (nearrec.ray: a sharded store's nodes as actors, on a local Ray cluster in the tests;
# serve_model's gRPC ingress, its proto loaded by grpcio-tools), Triton's and KServe's clients.
# TorchRec names the CUDA fbgemm-gpu wheel as a dependency, which breaks the CPU one: it is
# installed without dependencies, its pure-Python ones by hand.
$(VENV)/.deps: pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "maturin>=1.7,<2" "numpy>=1.24" "ml_dtypes>=0.5" "pytest>=8" "hypothesis>=6.100" ruff mypy import-linter==2.16 matplotlib $(TORCH)
	$(PIP) install -q pdoc $(FBGEMM) tensordict==0.15.3 torchmetrics==1.0.3 tqdm pyre-extensions rocksdict==0.3.29 grpcio==$(GRPC) grpcio-health-checking==$(GRPC) grpcio-reflection==$(GRPC) grpcio-tools==$(GRPC) prometheus-client "$(RAY)" "tritonclient[grpc,http]==2.73.0" kserve==0.21.0 pyarrow==22.0.0
	$(PIP) install -q --no-deps $(TORCHREC)
	# Triton Inference Server for tests/test_triton.py: the server and its Python backend from the
	# nvidia-pytriton wheel, unpacked, not installed (its Python side pins numpy < 2); and numpy < 2
	# in a directory of its own, first on the backend's path (its stub reads numpy 1's arrays only)
	rm -rf $(VENV)/triton && $(PIP) download -q --no-deps $(PYTRITON) -d $(VENV)/triton/wheel
	$(PY) -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2], [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.startswith(('pytriton/tritonserver/', 'nvidia_pytriton.libs/'))])" $(VENV)/triton/wheel/*.whl $(VENV)/triton
	chmod +x $(VENV)/triton/pytriton/tritonserver/bin/tritonserver $(VENV)/triton/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
	$(PIP) install -q --target $(VENV)/triton/numpy1 "numpy<2"
	# MovieLens-100K for the loader test, fetched (never committed: its licence forbids
	# redistribution) inside the recbole wheel; the test skips if the registry is unreachable.
	-$(PIP) download -q --no-deps $(RECBOLE) -d .cache/datasets
	touch $@

# Build the Rust extensions (release) into the virtualenv, each package importable in place: the
# product (`nearrec`), then the benchmark harnesses (`nearrec_bench`: bench/pyproject.toml, a
# distribution of its own that the product wheel leaves out; maturin's -m takes only a Cargo.toml,
# so it is built from bench/, and told which environment).
develop: build-deps $(VENV)/.deps
	$(VENV)/bin/maturin develop --release -q
	cd bench && VIRTUAL_ENV=$(CURDIR)/$(VENV) $(CURDIR)/$(VENV)/bin/maturin develop --release -q

# The main job: a synthetic RMC1 store (8 tables x 1M rows x dim 32, 1 GiB), then pooled lookups.
demo: develop
	nearrec build $(DEMO_STORE) --model rmc1 --rows 1000000 --overwrite
	nearrec info $(DEMO_STORE)
	nearrec lookup $(DEMO_STORE) --batch 256 --pooling 80 --repeat 50
	$(PY) examples/quickstart.py

# Debian packages pip cannot install, as COMMAND:PACKAGE. To build: protoc (etcd-client, the
# router's etcd client, compiles etcd's protos with it). For the tests as well: redis-server (the
# storage node's benchmark peer, started and stopped by the tests and the benchmark), openssl (the
# TLS tests' certificates), systemd-analyze (deploy/nearrec.service verified), etcd (a sharded
# store's membership, the partition tests' three members), nft (the partition tests' drops between
# network namespaces). Installed when missing, as root (CI, a
# fresh container); without root the missing ones are named in one line before anything runs,
# rather than as a build failure or test failures at the end of a long run.
BUILD_DEPS  := protoc:protobuf-compiler
SYSTEM_DEPS := $(BUILD_DEPS) redis-server:redis-server openssl:openssl systemd-analyze:systemd etcd:etcd-server nft:nftables
define apt_need
	@missing=""; for p in $(1); do command -v $${p%%:*} >/dev/null || missing="$$missing $${p##*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	    echo "make: this needs the Debian package(s)$$missing: apt-get install -y$$missing (as root)" >&2; \
	    exit 1; \
	fi; \
	apt-get update -q && apt-get install -y -q $$missing
endef
build-deps:
	$(call apt_need,$(BUILD_DEPS))
system-deps:
	$(call apt_need,$(SYSTEM_DEPS))

# The Rust layer contract (scripts/check_layers.py: the crate ladder, no module cycles) runs
# first: it takes a second and names the file and line at fault.
rust-check: build-deps
	cargo fmt --all --check
	python3 scripts/check_layers.py --self-test
	python3 scripts/check_layers.py
	cargo clippy --workspace --all-targets -- -D warnings
	# every doc comment's links resolve (one to a private item, or to an item gone, fails)
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q
	cargo test --workspace -q
	# the facade end to end, as a test, in the dev profile that `cargo test` has just built it
	# in (a release build was a second compile of the whole facade for the same check)
	cargo run -q -p nearrec --example serve

py-check: system-deps develop
	$(VENV)/bin/ruff check python bench/python tests examples scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports  # the package's layers (pyproject.toml [tool.importlinter])
	# the .pyi stubs against the built extensions; MYPYPATH makes the tree's stubs the ones found
	# (stubtest passes a module whose stub it cannot find, and nearrec_bench has no py.typed)
	MYPYPATH=python:bench/python $(PY) -m mypy.stubtest nearrec._native nearrec_bench._native
	$(PY) -m pytest -q
	$(PY) examples/quickstart.py

test: system-deps rust-check py-check

# The slow sweeps (hypothesis with many examples against nn.EmbeddingBag on every tier, 5,000
# random bit flips in stores served from SSD), which `pytest` leaves out by default.
test-slow: develop
	$(PY) -m pytest -q -m slow

# Every fuzz target (fuzz/fuzz_targets: cargo-fuzz, libFuzzer, nightly) for FUZZ_SECONDS each,
# from its seeds (fuzz/seeds/TARGET) and corpus (fuzz/corpus/TARGET, where what it finds goes;
# `cargo +nightly fuzz cmin -O TARGET` minimizes it); a crash is left in fuzz/artifacts/TARGET
# (fix it, then keep it in fuzz/seeds/TARGET under a name). The same checks run on stable over
# both in `make test` (crates/nearrec-fuzz/tests/corpus.rs). Record each run in fuzz/RESULTS.md.
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := manifest table_header shard_plan trace_file lookup_request wal_replay store_dir \
	wire_messages placement_plan delta_file tzrec_dump
fuzz:
	command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
	for t in $(FUZZ_TARGETS); do \
	    mkdir -p fuzz/corpus/$$t; \
	    cargo +nightly fuzz run -O $$t fuzz/corpus/$$t fuzz/seeds/$$t -- \
	        -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	        > fuzz/$$t.log 2>&1; rc=$$?; tail -12 fuzz/$$t.log; [ $$rc -eq 0 ] || exit $$rc; \
	done

bench: develop
	nearrec bench build
	nearrec bench sls

bench-quick: develop
	nearrec bench sls --quick

# The API reference, from the docstrings (pdoc), into target/docs/; CI builds it so that it
# cannot rot (a module that fails to import, a broken docstring reference, fails the build).
docs: develop
	$(VENV)/bin/pdoc -o target/docs --docformat restructuredtext nearrec $(addprefix nearrec.,\
	    store answers manifest config keyed remote distributed ray request trace plan datasets specs torch \
	    capture models gpu \
	    simulate cli)

# The product's wheel (abi3: one wheel for CPython >= 3.10), into dist/.
wheel: build-deps $(VENV)/.deps
	$(VENV)/bin/maturin build --release -q -o dist

# That wheel alone in a fresh virtualenv, as a user without torch or matplotlib installs it: the
# store, lookups on both tiers and the CLI (scripts/smoke.py). CI runs it after `make test`.
wheel-smoke: wheel
	rm -rf .venv-smoke
	python3 -m venv .venv-smoke
	.venv-smoke/bin/python -m pip install -q --upgrade pip
	.venv-smoke/bin/python -m pip install -q dist/nearrec-*-abi3-*.whl
	cd /tmp && $(CURDIR)/.venv-smoke/bin/python $(CURDIR)/scripts/smoke.py

clean:
	rm -rf target bench/scratch dist .venv-smoke
