"""opsctl config: what an inventory's `opsctl:` mapping may hold, for people and editors."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from opsctl.cli import _output


def register(app: typer.Typer) -> None:
    sub = typer.Typer(name="config", no_args_is_help=True, rich_markup_mode=None,
                      help="The inventory's opsctl: mapping: its JSON Schema for editors.\n\n"
                           "Example: opsctl config schema --out inventory.schema.json")
    app.add_typer(sub)

    @sub.command("schema")
    def schema_cmd(out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="FILE",
                                                     help="Write the schema to FILE instead of printing it.")) -> None:
        """Print the JSON Schema of an inventory variables file's opsctl: mapping (every key, its type,
        default and description; an unknown key is an error, as at load), for YAML language servers.

        Wire it in a group_vars/host_vars file with a first line (docs/inventory.md):

          # yaml-language-server: $schema=../inventory.schema.json

        Examples:

          opsctl config schema > inventories/site/inventory.schema.json

          opsctl config schema --out inventories/site/inventory.schema.json
        """
        import json

        from opsctl.config import inventory_schema

        text = json.dumps(inventory_schema(), indent=2, sort_keys=True) + "\n"
        if out is None:
            typer.echo(text, nl=False)
            return
        from opsctl.errors import ConfigError

        try:
            out.write_text(text)
        except OSError as exc:
            raise ConfigError(f"cannot write the schema to {out}: {exc.strerror}",
                              "name a writable file with --out (or redirect the printed schema)") from None
        _output.info(f"wrote the inventory schema to {out} ({len(text)} bytes)")
