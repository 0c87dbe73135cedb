//! qlist: the end-to-end tests, benchmarks and examples live in this root package.
