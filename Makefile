# One build profile (release) for tests, benchmarks and the demo: RocksDB is most of a
# ~13-minute first build on 2 cores, so it is compiled once, into a target dir that
# outlives clones.
CARGO_TARGET_DIR ?= /var/tmp/qlist-target
export CARGO_TARGET_DIR

.PHONY: deps deps-all test-deps build test lint demo bench bench-peers-smoke clean-demo

# What building and running need (redis-server, libclang, make, a C/C++ compiler): the
# first `make demo` installs no more than that.
deps:
	bash scripts/deps.sh --runtime

# Also the tools only the tests run (redis-cli, redis-py, Prometheus, Slurm with MUNGE, and
# in a venv the S3 server weed, the Parquet readers DuckDB and pyarrow, and
# kubernetes-validate).
deps-all:
	bash scripts/deps.sh

test-deps:
	bash scripts/test-deps.sh

# A cold target dir compiles RocksDB from source first: say so, or it looks like a hang.
# `cargo test` leaves binaries with the test hooks in target/release; `cargo build` puts
# the release ones back (the test builds keep their own files in deps/), and
# check-release.sh proves it on the files: no test hooks, no ID client in merger.
build: deps
	@ls $$CARGO_TARGET_DIR/release/build/librocksdb-sys-*/out/librocksdb.a >/dev/null 2>&1 || echo "qlist: first build: compiling RocksDB from source into $$CARGO_TARGET_DIR (about 13 minutes on 2 cores; later builds reuse it)" >&2
	cargo build --release --workspace --bins
	bash scripts/check-release.sh

# deps.sh's detection on fake trees (no build needed, so it runs first), no import circle
# in any crate (scripts/check_imports.py), the whole test
# suite (real redis-server processes, real RocksDB), a compile check of the benchmarks,
# the release check (first on the test builds, which must have the hooks: the check can
# see them; then on the release build, which must not), and a small run of the demo (the
# README's first command) on the release binaries.
test: deps-all test-deps build
	python3 scripts/check_imports.py
	cargo test --release --workspace --no-fail-fast
	cargo bench --workspace --no-run
	bash scripts/check-release.sh --hooked
	cargo build --release --workspace --bins
	bash scripts/check-release.sh
	d=$$(mktemp -d) && QLIST_DEMO_DIR=$$d/demo QLIST_DEMO_ITEMS=20000 bash scripts/demo.sh && rm -rf $$d

# The layout rules (README, "Layout"), formatting, lints and docs, on the release profile the tests built (cargo doc --release
# reuses its build scripts; a plain cargo doc would compile RocksDB again in debug).
lint:
	bash scripts/check-layout.sh
	cargo fmt --all --check
	cargo clippy --release --workspace --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --release --no-deps --workspace

# The main job end to end on a local quorum it starts and stops itself.
demo: build
	bash scripts/demo.sh

bench: build
	cargo bench --workspace

# The merge against DuckDB, Polars, cat and sort at the smoke size: every row (each Parquet
# writer with snappy and with zstd) runs once and its output is checked; the times of so
# small a list mean nothing (scripts/bench-merge-peers.sh).
bench-peers-smoke: build
	QLIST_PEER_ITEMS=20000 QLIST_PEER_SHARDS=4 QLIST_PEER_REPS=1 bash scripts/bench-merge-peers.sh >/dev/null
