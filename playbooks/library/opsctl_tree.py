#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: a directory tree in one remote call (the prepare play's host layout and
staged release). Each `file`, `copy` or `file: state=link` task is a remote Python run of its
own (about 0.5 s of CPU on each side); a release has ten or more of them.

Standard library only (it runs with the host's python3)."""
from __future__ import annotations

DOCUMENTATION = r"""
module: opsctl_tree
short_description: directories, files and links under one root, created or updated in one call
options:
  root: {description: the tree's top directory (created with mode 0755), type: path, required: true}
  clean: {description: remove ROOT first (a staging directory rebuilt from scratch), type: bool, default: false}
  dirs:
    description: directories under ROOT ("." is ROOT), each {path, mode, owner}
    type: list
    elements: dict
    default: []
  files:
    description: files under ROOT, each {path, content_b64, mode} (base64: Ansible never templates it);
      rewritten only when content or mode differs
    type: list
    elements: dict
    default: []
  links:
    description: symbolic links under ROOT, each {path, target}
    type: list
    elements: dict
    default: []
  absent:
    description: paths under ROOT (files or links) removed when present
    type: list
    elements: str
    default: []
"""

RETURN = r"""
changed_paths: {description: the paths (relative to ROOT) created or changed, type: list}
"""

import base64
import binascii
import os
import pwd
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule


def _mode(value, default):
    return int(str(value), 8) if value not in (None, "") else default


def _ensure_dir(path, mode, owner):
    changed = False
    if not os.path.isdir(path):
        os.makedirs(path, exist_ok=True)
        changed = True
    st = os.stat(path)
    if st.st_mode & 0o7777 != mode:
        os.chmod(path, mode)
        changed = True
    if owner:
        pw = pwd.getpwnam(owner)
        if (st.st_uid, st.st_gid) != (pw.pw_uid, pw.pw_gid):
            os.chown(path, pw.pw_uid, pw.pw_gid)
            changed = True
    return changed


def _ensure_file(path, data, mode):
    try:
        with open(path, "rb") as f:
            same = f.read() == data
        if same and os.stat(path).st_mode & 0o7777 == mode:
            return False
        if same:
            os.chmod(path, mode)
            return True
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".opsctl-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)   # whole or not at all
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


def _ensure_link(path, target):
    if os.path.islink(path) and os.readlink(path) == target:
        return False
    tmp = path + ".opsctl-new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, path)
    return True


def main():
    module = AnsibleModule(argument_spec=dict(
        root=dict(type="path", required=True),
        clean=dict(type="bool", default=False),
        dirs=dict(type="list", elements="dict", default=[]),
        files=dict(type="list", elements="dict", default=[]),
        links=dict(type="list", elements="dict", default=[]),
        absent=dict(type="list", elements="str", default=[]),
    ), supports_check_mode=False)
    p = module.params
    root = p["root"]
    changed_paths = []
    try:
        if p["clean"] and os.path.lexists(root):
            shutil.rmtree(root)
            changed_paths.append(".")
        if _ensure_dir(root, 0o755, None) and "." not in changed_paths:
            changed_paths.append(".")
        for d in p["dirs"]:
            rel = d["path"]
            if _ensure_dir(os.path.join(root, rel), _mode(d.get("mode"), 0o755), d.get("owner") or None):
                changed_paths.append(rel)
        for f in p["files"]:
            rel = f["path"]
            full = os.path.join(root, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if _ensure_file(full, base64.b64decode(f.get("content_b64") or ""), _mode(f.get("mode"), 0o644)):
                changed_paths.append(rel)
        for link in p["links"]:
            if _ensure_link(os.path.join(root, link["path"]), link["target"]):
                changed_paths.append(link["path"])
        for rel in p["absent"]:
            full = os.path.join(root, rel)
            if os.path.lexists(full):
                os.unlink(full)
                changed_paths.append(rel)
    except (OSError, KeyError, binascii.Error) as exc:
        module.fail_json(msg=f"{root}: {exc}", changed=bool(changed_paths), changed_paths=changed_paths)
    module.exit_json(changed=bool(changed_paths), changed_paths=changed_paths)


if __name__ == "__main__":
    main()
