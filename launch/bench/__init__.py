"""Benchmarks, each a module run from the repository root as `python -m launch.bench.<script>` (README.md here)."""
