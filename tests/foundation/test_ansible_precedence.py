"""opsctl reads an inventory's variables as Ansible does (issue #34): the same inventory loaded
through Ansible's own InventoryManager / VariableManager and through opsctl gives every host
the same `opsctl:` mapping - and the same typed settings, SSH facts included - on the shipped
inventories and on nested groups, group priorities, inline `vars:`, top-level groups and
ungrouped hosts. Where Ansible's answer (a mapping set at two levels is replaced whole) and a
deep merge differ, opsctl refuses with the fix instead of reading the host another way.
Plain data: tmp inventories, no host."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from opsctl.config import _host_config, load_inventory
from opsctl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (REPO / "inventories").iterdir() if (p / "hosts.yml").is_file())
SSH_VARS = ("ansible_host", "ansible_user", "ansible_port", "ansible_ssh_private_key_file", "ansible_ssh_common_args",
            "ansible_ssh_extra_args")


def ansible_vars(inventory: Path) -> dict[str, dict]:
    """Every host's variables as Ansible itself resolves them (no play: inventory precedence only)."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    im = InventoryManager(loader=loader, sources=[str(inventory)])   # the directory, as opsctl's playbook runs pass it
    vm = VariableManager(loader=loader, inventory=im)
    return {h.name: _plain(vm.get_vars(host=h, include_hostvars=False)) for h in im.get_hosts()}


def _plain(v):
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, str):
        return str(v)
    return v


def assert_same_as_ansible(inventory: Path) -> dict[str, dict]:
    """Ansible's and opsctl's reading of every host agree: the raw `opsctl:` mapping, and the
    typed settings and SSH facts opsctl builds from Ansible's variables against its own."""
    ours = load_inventory(inventory)
    theirs = ansible_vars(inventory)
    assert sorted(theirs) == sorted(ours.hosts)
    for name, host in ours.hosts.items():
        from_ansible = _host_config(name, host.groups, theirs[name], inventory)
        assert from_ansible.settings == host.settings, name
        assert from_ansible.ssh == host.ssh, name
    return theirs


def opsctl_mapping(inventory: Path) -> dict:
    return yaml.safe_load((inventory / "group_vars" / "all.yml").read_text())["opsctl"]


@pytest.mark.parametrize("name", SHIPPED)
def test_the_shipped_inventories_read_as_ansible_reads_them(name):
    theirs = assert_same_as_ansible(REPO / "inventories" / name)
    assert all(isinstance(v.get("opsctl"), dict) for v in theirs.values())


def test_lab_fleet_lab3_is_group_vars_all_plus_extra_env_and_nothing_else():
    """host_vars/lab3.yml repeats group_vars/all.yml's mapping whole (Ansible replaces a mapping):
    it must not drift from it."""
    inv = REPO / "inventories" / "lab-fleet"
    lab3 = yaml.safe_load((inv / "host_vars" / "lab3.yml").read_text())["opsctl"]
    assert lab3.pop("extra_env") == {"NCCL_P2P_LEVEL": "SYS"}
    assert lab3 == opsctl_mapping(inv)


def _nested(tmp_path: Path, hosts_yml: str, group_vars: dict[str, dict | None], host_vars: dict | None = None,
            all_opsctl: bool = False) -> Path:
    """An inventory of the lab's settings: group_vars/<g>.yml with a complete opsctl: mapping,
    the lab's with `changes`, for each group named (None: no file)."""
    inv = tmp_path / "inv"
    base = opsctl_mapping(REPO / "inventories" / "lab")
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(hosts_yml)
    if all_opsctl:
        (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump({"opsctl": base}))
    for g, changes in group_vars.items():
        if changes is not None:
            m = copy.deepcopy(base)
            m.update(changes)
            (inv / "group_vars" / f"{g}.yml").write_text(yaml.safe_dump({"opsctl": m}))
    for h, data in (host_vars or {}).items():
        (inv / "host_vars").mkdir(exist_ok=True)
        (inv / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump(data))
    return inv


NESTED = """\
all:
  children:
    outer:
      children:
        inner:
          hosts:
            h1: {ansible_host: 10.0.0.1}
    flat:
      hosts:
        h1: {}
        h2: {ansible_host: 10.0.0.2}
"""


def test_a_deeper_group_wins_over_one_listed_after_it(tmp_path):
    """The issue's case: h1 in `inner` (depth 2, under `outer`, keep_releases 7) and in `flat`
    (depth 1, listed after `outer`, keep_releases 3): Ansible says 7, and so does opsctl."""
    inv = _nested(tmp_path, NESTED, {"inner": {"keep_releases": 7}, "flat": {"keep_releases": 3}})
    theirs = assert_same_as_ansible(inv)
    assert theirs["h1"]["opsctl"]["keep_releases"] == 7
    hosts = load_inventory(inv).hosts
    assert hosts["h1"].settings.keep_releases == 7 and hosts["h2"].settings.keep_releases == 3


def test_group_priority_then_name_order_groups_of_one_depth(tmp_path):
    two = """\
all:
  children:
    alpha:
      hosts: {h1: {ansible_host: 10.0.0.1}}
    beta:
      hosts: {h1: {}}
"""
    inv = _nested(tmp_path / "name", two, {"alpha": {"keep_releases": 4}, "beta": {"keep_releases": 6}})
    assert assert_same_as_ansible(inv)["h1"]["opsctl"]["keep_releases"] == 6   # same depth: by name, beta last
    with_priority = two.replace("    alpha:\n", "    alpha:\n      vars: {ansible_group_priority: 10}\n")
    inv = _nested(tmp_path / "priority", with_priority, {"alpha": {"keep_releases": 4}, "beta": {"keep_releases": 6}})
    assert assert_same_as_ansible(inv)["h1"]["opsctl"]["keep_releases"] == 4   # a higher priority merges later


def test_inline_vars_rank_below_group_vars_files_and_host_vars_last(tmp_path):
    m = opsctl_mapping(REPO / "inventories" / "lab")
    inline = yaml.safe_dump({"all": {"children": {"gpu": {
        "vars": {"opsctl": {**m, "keep_releases": 9}},      # inline vars of a child group ...
        "hosts": {"h1": {"ansible_host": "10.0.0.1"}, "h2": {"ansible_host": "10.0.0.2",
                                                           "opsctl": {**m, "keep_releases": 2}}}}}}})
    inv = _nested(tmp_path, inline, {}, all_opsctl=True)  # ... lose to group_vars/all.yml (Ansible's order)
    theirs = assert_same_as_ansible(inv)
    assert theirs["h1"]["opsctl"]["keep_releases"] == m["keep_releases"]
    assert theirs["h2"]["opsctl"]["keep_releases"] == 2
    inv2 = _nested(tmp_path / "hv", inline, {}, host_vars={"h2": {"opsctl": {**m, "keep_releases": 8}}}, all_opsctl=True)
    assert assert_same_as_ansible(inv2)["h2"]["opsctl"]["keep_releases"] == 8   # host_vars/ over inline host vars


def test_top_level_groups_beside_all_and_ungrouped_hosts(tmp_path):
    text = """\
all:
  hosts:
    loose: {ansible_host: 10.0.0.9}
  children:
    gpu:
      hosts: {h1: {ansible_host: 10.0.0.1}}
extra:
  hosts: {h1: {}}
"""
    inv = _nested(tmp_path, text, {"extra": {"keep_releases": 11}, "ungrouped": {"keep_releases": 12},
                                   "gpu": {"keep_releases": 10}}, all_opsctl=True)
    theirs = assert_same_as_ansible(inv)
    assert theirs["h1"]["opsctl"]["keep_releases"] == 10   # both depth 1: by name, gpu after extra
    assert theirs["loose"]["opsctl"]["keep_releases"] == 12


def test_a_partial_opsctl_mapping_that_ansible_would_replace_is_refused_with_the_fix(tmp_path):
    inv = _nested(tmp_path, NESTED, {"inner": None, "flat": None}, all_opsctl=True,
                  host_vars={"h1": {"opsctl": {"keep_releases": 7}}})
    theirs = ansible_vars(inv)
    assert theirs["h1"]["opsctl"] == {"keep_releases": 7}   # Ansible: the host's mapping, whole
    with pytest.raises(ConfigError) as exc:
        load_inventory(inv)
    line = exc.value.one_line()
    assert f"{inv}/host_vars/h1.yml:1: host h1: this opsctl: mapping replaces the one in " in line, line
    assert "group_vars/all.yml whole, as Ansible does" in line and "and 12 more set there would not apply" in line
    assert "install_root" in exc.value.details["keys_not_applied"]
    assert exc.value.fix.startswith(f"write host h1's complete opsctl: mapping in {inv}/host_vars/h1.yml")
    # the complete mapping is read as Ansible reads it
    full = {**opsctl_mapping(REPO / "inventories" / "lab"), "keep_releases": 7}
    (inv / "host_vars" / "h1.yml").write_text(yaml.safe_dump({"opsctl": full}))
    assert assert_same_as_ansible(inv)["h1"]["opsctl"]["keep_releases"] == 7
    # a nested mapping left partial is refused too (gate: {repeats: 2} would drop the lab's gate)
    full["gate"] = {"repeats": 2}
    (inv / "host_vars" / "h1.yml").write_text(yaml.safe_dump({"opsctl": full}))
    with pytest.raises(ConfigError) as exc:
        load_inventory(inv)
    assert "gate.concurrency" in exc.value.problem


def test_group_vars_as_a_directory_and_without_extension(tmp_path):
    inv = _nested(tmp_path, NESTED, {"inner": None, "flat": None})
    m = opsctl_mapping(REPO / "inventories" / "lab")
    (inv / "group_vars" / "outer").mkdir()
    (inv / "group_vars" / "outer" / "a.yml").write_text(yaml.safe_dump({"opsctl": {**m, "keep_releases": 21}}))
    (inv / "group_vars" / "outer" / "b.yml").write_text(yaml.safe_dump({"other": 1}))
    (inv / "group_vars" / "flat").write_text(yaml.safe_dump({"opsctl": {**m, "keep_releases": 22}}))
    theirs = assert_same_as_ansible(inv)
    assert theirs["h1"]["opsctl"]["keep_releases"] == 21 and theirs["h2"]["opsctl"]["keep_releases"] == 22
