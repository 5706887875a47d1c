"""Benchmark: Stations against the pinned Durable Streams reference server. Run
``python3 -m bench --help`` from the repository root; see bench/README.md."""
