"""The one error of a config that cannot be used."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key."""
