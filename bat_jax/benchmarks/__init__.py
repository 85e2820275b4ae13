"""The bundled staged benchmarks, each a plug-in behind the contract of `bat_jax.staged_benchmark`.

`imaging`: the medical-imaging suite. `tabular`: the tabular data-analysis suite. Modules of the same role share a
name (`benchmark`, `rubric`, `teacher`); a run names its benchmark in gin, and the core imports neither.
"""
