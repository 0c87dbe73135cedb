# One build profile (release) for tests, benchmarks and the demo: RocksDB is a ~13-minute
# C++ build on 2 cores, so it is compiled once, into a target dir that outlives clones.
CARGO_TARGET_DIR ?= /var/tmp/qlist-target
export CARGO_TARGET_DIR

.PHONY: deps build test demo bench clean-demo

deps:
	bash scripts/deps.sh

build: deps
	cargo build --release --workspace --bins

# The whole test suite (real redis-server processes, real RocksDB), a compile check of
# the benchmarks, and a small run of the demo (the README's first command).
test: build
	cargo test --release --workspace
	cargo bench --workspace --no-run
	d=$$(mktemp -d) && QLIST_DEMO_DIR=$$d/demo QLIST_DEMO_ITEMS=20000 bash scripts/demo.sh && rm -rf $$d

# The main job end to end on a local quorum it starts and stops itself.
demo: build
	bash scripts/demo.sh

bench: build
	cargo bench --workspace
