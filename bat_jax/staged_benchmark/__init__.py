"""The staged-benchmark plug-in interface (paper Appendix A.3).

`contract`: what a benchmark declares (`StagedBenchmark`, `Task`, the E2E `Reduction`). `episode`: the action-level
episode its teachers play (`ActionPolicy`, `Conversation`, `RecordedEpisode`, host-side evidence). Benchmarks live
in `bat_jax/benchmarks/` (or anywhere on the import path) and are named by a run's gin file; nothing here imports
one."""
