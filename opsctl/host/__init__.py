"""Everything that touches a host: the connection (run/put/get with one Result type,
opsctl.host.connection), the one SSH configuration and its renderings (opsctl.host.ssh), and
the facts, each a command and its parser (opsctl.host.facts)."""
