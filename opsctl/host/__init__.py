"""How opsctl reaches a host: the one SSH configuration and its renderings (opsctl.host.ssh)."""
