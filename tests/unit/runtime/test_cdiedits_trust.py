"""CDI spec files and their directories are held to the config files' trust rule
(:func:`nvshim.files.check_trusted`): a spec others could have written is skipped by every
scan (the registry, the index a create reads), named by ``nvshim cdi list`` and ``nvshim
doctor``, and a create asking for a device only such a spec has fails in one line naming
the spec and the rule. The index records its verdicts so that a spec changed after
``config compile`` is judged again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest
from click.testing import CliRunner

from nvshim.cdi import index as cdiindex
from nvshim.cdi.registry import load_registry, resolve_devices
from nvshim.cli.cmd_cdi import cdi as cdi_group
from nvshim.config import Config
from nvshim.errors import CdiError
from nvshim.host.discovery import Host
from nvshim.runtime.cdiedits import inject_cdi

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the trust rule protects root only")

NOBODY = 65534


def spec(devices: Dict[str, str], kind: str = "acme.com/dev") -> Dict[str, Any]:
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": {"env": [e]}} for n, e in devices.items()],
    }


def put(directory: Path, name: str, doc: Dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    path = directory / name
    if name.endswith(".json"):
        path.write_text(json.dumps(doc))
    else:
        import yaml

        path.write_text(yaml.safe_dump(doc))
    os.chmod(path, 0o644)
    return path


def untrust(path: Path, how: str) -> str:
    """Make ``path`` (or its directory) fail the rule one way; the words the reason holds."""
    if how == "owner":
        os.chown(path, NOBODY, NOBODY)
        return f"is owned by uid {NOBODY}, not root"
    if how == "mode":
        os.chmod(path, 0o666)
        return "is writable by group or others (mode 0666)"
    os.chmod(path.parent, 0o777)
    return f"directory {path.parent} can be written by others (uid 0, mode 0777)"


HOWS = ["owner", "mode", "dir"]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("name", ["evil.json", "evil.yaml"])
def test_an_untrusted_spec_is_skipped_by_every_scan(tmp_path: Path, how: str, name: str) -> None:
    """A spec owned by uid 65534, a 0666 spec, or a spec in a 0777 directory gives no device,
    through a full scan and through the index (built, then read), and is a problem naming
    the file and the rule; a trusted spec in another directory still resolves."""
    good, cdi = tmp_path / "good", tmp_path / "cdi"
    put(good, "good.json", spec({"ok": "OK=1"}))
    evil = put(cdi, name, spec({"bad": "EVIL=1"}))
    reason = untrust(evil, how)
    index = str(tmp_path / "index.json")
    dirs = [str(good), str(cdi)]
    for registry in (
        load_registry(dirs),
        cdiindex.registry_for(dirs, ["acme.com/dev=bad"], index, True)[0],
        cdiindex.registry_for(dirs, ["acme.com/dev=bad"], index, True)[0],
    ):
        assert "acme.com/dev=bad" not in registry.devices
        assert resolve_devices(registry, ["acme.com/dev=ok"]).env == ("OK=1",)
        named = [str(p) for p in registry.problems if p.path == str(evil)]
        assert len(named) == 1, registry.problems
        head = f"{evil}: $: CDI spec " + ("" if how == "dir" else f"{evil} ")
        assert named[0].startswith(head + reason), named


def test_a_sticky_world_writable_dir_is_as_trusted_as_for_the_config(tmp_path: Path) -> None:
    """The rule is the config's own: a root-owned 0644 spec in a sticky 1777 directory (where
    others cannot replace root's files) is loaded."""
    cdi = tmp_path / "cdi"
    put(cdi, "a.json", spec({"a": "A=1"}))
    os.chmod(cdi, 0o1777)
    assert load_registry([str(cdi)]).names() == ["acme.com/dev=a"]


def config_for(tmp_path: Path, dirs: List[Path]) -> Config:
    return Config(
        driver_root=str(tmp_path / "noroot"),
        cdi_spec_dirs=tuple(map(str, dirs)),
        source=str(tmp_path / "config.yaml"),
    )


@pytest.mark.parametrize("how", HOWS)
def test_a_create_asking_for_a_device_only_an_untrusted_spec_has_fails_in_one_line(
    tmp_path: Path, how: str
) -> None:
    """inject_cdi for a device that only an untrusted spec defines raises one line naming
    the device, the spec and the rule; the same device from a trusted spec elsewhere is
    injected from that one."""
    evil = put(tmp_path / "run-cdi", "evil.json", spec({"bad": "EVIL=1"}))
    reason = untrust(evil, how)
    config = config_for(tmp_path, [tmp_path / "etc-cdi", tmp_path / "run-cdi"])
    with pytest.raises(CdiError) as err:
        inject_cdi(["acme.com/dev=bad"], config, ("compute",), Host(config.driver_root))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"CDI device acme.com/dev=bad is defined only by CDI spec {evil}, which nvshim does "
        "not trust and skips: "
    ), message
    assert reason in message and f"(config {config.source})" in message
    put(tmp_path / "etc-cdi", "good.json", spec({"bad": "GOOD=1"}))
    got = inject_cdi(["acme.com/dev=bad"], config, ("compute",), Host(config.driver_root))
    assert got.edits.env == ("GOOD=1",)


@pytest.mark.parametrize("name", ["late.json", "late.yaml"])
@pytest.mark.parametrize("how", ["owner", "mode", "dir"])
def test_a_spec_made_untrusted_after_compile_is_judged_again(
    tmp_path: Path, name: str, how: str
) -> None:
    """An index written while the spec was trusted does not vouch for it once its owner,
    mode or directory changed: the next create refuses it (a YAML spec's document is in
    the index, a JSON spec is read again at create)."""
    cdi = tmp_path / "cdi"
    late = put(cdi, name, spec({"x": "X=1"}))
    index = str(tmp_path / "index.json")
    cdiindex.refresh([str(cdi)], index)
    registry, source = cdiindex.registry_for([str(cdi)], ["acme.com/dev=x"], index, False)
    assert source == f"CDI index {index}" and "acme.com/dev=x" in registry.devices
    untrust(late, how)
    registry, _ = cdiindex.registry_for([str(cdi)], ["acme.com/dev=x"], index, True)
    assert "acme.com/dev=x" not in registry.devices
    assert "acme.com/dev=x" in registry.untrusted


def test_a_json_spec_is_checked_when_read_even_if_the_index_still_matches(tmp_path: Path) -> None:
    """A create reads a JSON spec's bytes at create time and checks the file it opened: a
    spec given away after its index entry was written (here: the entry made to match it
    again, as a stat taken just before the change would) is still refused."""
    cdi = tmp_path / "cdi"
    late = put(cdi, "late.json", spec({"x": "X=1"}))
    index = tmp_path / "index.json"
    cdiindex.refresh([str(cdi)], str(index))
    os.chown(late, NOBODY, NOBODY)
    doc = json.loads(index.read_text())
    doc["entries"][0]["sig"] = cdiindex._sig(str(late))  # the race: the stat matched
    index.write_text(json.dumps(doc))
    os.chmod(index, 0o644)
    registry, source = cdiindex.registry_for([str(cdi)], ["acme.com/dev=x"], str(index), False)
    assert source == f"CDI index {index}"
    assert "acme.com/dev=x" not in registry.devices
    assert any(f"is owned by uid {NOBODY}" in p.message for p in registry.problems)


def test_cdi_list_names_the_skipped_spec(tmp_path: Path) -> None:
    """`nvshim cdi list` warns naming the untrusted spec and the rule, and lists only the
    trusted spec's devices; --format json has the same problem."""
    cdi = tmp_path / "cdi"
    put(cdi, "good.json", spec({"ok": "OK=1"}))
    evil = put(cdi, "evil.json", spec({"bad": "EVIL=1"}))
    os.chown(evil, NOBODY, NOBODY)
    result = CliRunner().invoke(cdi_group, ["list", "--spec-dir", str(cdi)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["acme.com/dev=ok"]
    assert (
        f"warning: {evil}: $: CDI spec {evil} is owned by uid {NOBODY}, not root" in result.stderr
    )
    as_json = CliRunner().invoke(cdi_group, ["list", "--spec-dir", str(cdi), "--format", "json"])
    problems = json.loads(as_json.stdout)["problems"]
    assert [p["file"] for p in problems] == [str(evil)]


def test_doctor_fails_naming_each_untrusted_spec_and_its_fix(tmp_path: Path) -> None:
    """doctor's cdi-spec-trust check fails once per spec the rule refuses (file and
    directory cases), naming it and the fix; a node whose specs are all root's is ok."""
    from nvshim.node.doctor.host import check_cdi_spec_trust

    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    put(etc, "good.json", spec({"ok": "OK=1"}))
    assert [(f.status, f.message) for f in check_cdi_spec_trust([str(etc), str(run)])] == [
        ("ok", f"1 CDI spec file in {etc}, {run}: each owned by root and writable by root only")
    ]
    evil = put(etc, "evil.yaml", spec({"bad": "EVIL=1"}))
    os.chmod(evil, 0o666)
    other = put(run, "other.json", spec({"o": "O=1"}))
    os.chmod(run, 0o777)
    findings = check_cdi_spec_trust([str(etc), str(run)])
    assert [(f.check, f.status) for f in findings] == [("cdi-spec-trust", "fail")] * 2
    assert findings[0].message.startswith(f"CDI spec {evil} is writable by group or others")
    assert "nvshim-runtime skips it" in findings[0].message
    assert "chmod go-w" in findings[0].fix and str(evil) in findings[0].fix
    assert findings[1].message.startswith(f"CDI spec directory {run} can be written by others")
    assert f"{other.name} could be replaced" in findings[1].message
    assert "chmod go-w" in findings[1].fix and str(run) in findings[1].fix
