"""Helpers the tests share across folders (importable as `support` from any test)."""
