"""Task families (seven tracks), the action-level episode interface, scripted/LLM teachers and the held-out suite.

Details: docs/design.md.
"""
