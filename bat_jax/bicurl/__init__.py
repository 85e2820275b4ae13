"""BiCuRL, the composition layer: the experiment and the jobs that wire the mechanisms below into one run.

Details: docs/design.md.
"""
