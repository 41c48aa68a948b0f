"""Internals of the lab emulator (stdlib only)."""
