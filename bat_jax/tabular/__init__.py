"""The tabular data-analysis suite: a second bundled staged benchmark (inspect → clean → analyse → report).

Not medical imaging: each task is one small CSV table with seeded defects and one analysis question (a group mean,
an outlier-filtered median, the columns most correlated with a target). A run names it in gin
(`experiment.Components.benchmark = @tabular.TabularBenchmark()`, `gin/tabular_tiny.gin`); the core never imports
it (`tests/test_layers.py`).
"""
