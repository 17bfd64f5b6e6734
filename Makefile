# Two entry points that work on a fresh Debian 12 machine with the Rust toolchain:
#   make demo   installs what is missing, builds, and runs a local cluster training DLRM on generated data
#   make test   installs what is missing and runs the whole test suite
.PHONY: deps build demo test lint bench

deps:
	./scripts/install-deps.sh

build: deps
	cargo build --release --workspace --bins

demo: build
	cargo run --release -p trainer -- demo $(ARGS)

test: deps
	cargo test --workspace --no-fail-fast

lint: deps
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
