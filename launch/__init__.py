"""Launch-side tooling beside the `bat_jax` package: set-up scripts, sweeps and benchmarks.

Run from the repository root (`python -m launch.sweep`, `python -m launch.bench.<script>`)."""
