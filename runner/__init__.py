"""cko host controller: CLI, sandbox, store, identity, policy."""

__version__ = "0.1.0"
