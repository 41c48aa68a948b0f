"""Loads opsctl.checks.plugin (options --inventory/--limit, ssh_config from the inventory,
fixtures) unless it is loaded already (`-p opsctl.checks.plugin`)."""
from __future__ import annotations


def pytest_addoption(parser, pluginmanager):
    if not pluginmanager.has_plugin("opsctl.checks.plugin"):
        from opsctl.checks import plugin

        pluginmanager.register(plugin, "opsctl.checks.plugin")
