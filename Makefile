# Two entry points that work on a fresh Debian 12 machine with the Rust toolchain:
#   make demo   installs what is missing, builds, and runs a local cluster training DLRM on generated data
#   make test   installs what is missing and runs the whole test suite
.PHONY: deps build demo test python-test k8s-check lint

deps:
	./scripts/install-deps.sh

build: deps
	cargo build --release --workspace --bins

demo: build
	cargo run --release -p trainer -- demo $(ARGS)

test: deps
	cargo test --workspace --no-fail-fast
	$(MAKE) python-test
	$(MAKE) k8s-check

# The Python package (pstrain) with real PyTorch in a virtual environment outside the clone: scripts/python-test.sh.
python-test: deps
	./scripts/python-test.sh

# Offline validation of every Kubernetes object, and a real Prometheus scraping a ps-server and a trainer.
k8s-check: deps
	./scripts/k8s/validate.sh
	./scripts/k8s/prometheus-check.sh

# Import circles between sibling modules of each crate: none beyond the shrinking list in
# scripts/import-cycles.allow (scripts/import_cycles.py).
lint: deps
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	python3 scripts/import_cycles.py
