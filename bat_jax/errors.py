"""Configuration errors: what a user fixes by changing a binding or a path, reported by launch as one line.

Details: docs/design.md.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A configuration problem the user can fix; the message names the binding or path and what to change."""


class ConfigValueError(ConfigError, ValueError):
    """A bound value the run cannot use (an unknown track, stage, teacher or variant; a value out of range)."""


class ConfigPathError(ConfigError, FileNotFoundError):
    """A path a binding names that does not exist or is incomplete (a checkpoint or bank directory)."""
