"""The tabular data-analysis suite: a second bundled staged benchmark (inspect → clean → analyse → report).

Details: docs/design.md.
"""
