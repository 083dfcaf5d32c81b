"""CDI spec validation: names, versions, strict decoding, schema and semantic rules, CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvshim.cdi.load import load_spec_file, parse_spec
from nvshim.cdi.names import is_qualified_name, parse_qualified_name
from nvshim.cdi.schema import check_schema, schema_path, validate_file, validate_spec
from nvshim.cdi.version import CURRENT_VERSION, KNOWN_VERSIONS, required_version
from nvshim.cdi.write import dump_spec, spec_to_dict
from nvshim.cli.cmd_cdi import cdi as cdi_group
from nvshim.edits import DeviceNode, Edits, Hook, Mount
from nvshim.errors import CdiError, CdiProblem

REPO = Path(__file__).resolve().parents[3]

HEAD = 'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\n'
DEV0 = 'devices:\n  - name: "0"\n    containerEdits:\n      env: [A=1]\n'
ALL_VERSIONS = "1.1.0, 1.0.0, 0.8.0, 0.7.0, 0.6.0, 0.5.0, 0.4.0, 0.3.0"


def _case(
    name: str,
    text: str,
    expected: List[str],
    ext: str = "yaml",
    schema: bool = True,
) -> Any:
    """One invalid file: its text, the exact problem lines (without the file prefix),
    and whether the JSON schema alone must also flag the first problem's path."""
    return pytest.param(ext, text, expected, schema, id=name)


INVALID = [
    # --- kind
    _case(
        "kind-no-slash",
        'cdiVersion: "0.5.0"\nkind: foo\n' + DEV0,
        ['$.kind: kind "foo" must be <vendor>/<class>, like nvidia.com/gpu'],
    ),
    _case(
        "kind-trailing-slash",
        'cdiVersion: "0.5.0"\nkind: vendor.com/foo/\n' + DEV0,
        ['$.kind: invalid kind "vendor.com/foo/": class name "foo/" has invalid character "/"'],
    ),
    _case(
        "kind-two-slashes",
        'cdiVersion: "0.5.0"\nkind: vendor.com/foo/bar\n' + DEV0,
        [
            '$.kind: invalid kind "vendor.com/foo/bar": class name "foo/bar" has invalid '
            'character "/"'
        ],
    ),
    _case(
        "kind-vendor-digit",
        'cdiVersion: "0.5.0"\nkind: 1vendor.com/x\n' + DEV0,
        [
            '$.kind: invalid kind "1vendor.com/x": vendor name "1vendor.com" must start with a '
            "letter"
        ],
    ),
    _case(
        "kind-empty-vendor",
        'cdiVersion: "0.5.0"\nkind: /gpu\n' + DEV0,
        ['$.kind: invalid kind "/gpu": empty vendor name'],
    ),
    _case(
        "kind-class-ends-dash",
        'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu-\n' + DEV0,
        [
            '$.kind: invalid kind "nvidia.com/gpu-": class name "gpu-" must end with a letter '
            "or digit"
        ],
    ),
    _case(
        "kind-not-string",
        'cdiVersion: "0.5.0"\nkind: 5\n' + DEV0,
        ["$.kind: must be a string, got an integer"],
    ),
    _case("kind-missing", 'cdiVersion: "0.5.0"\n' + DEV0, ["$.kind: required field is missing"]),
    # --- device names
    _case(
        "name-space",
        HEAD + 'devices:\n  - name: "bad name!"\n    containerEdits: {env: [A=1]}\n',
        ['$.devices[0].name: device name "bad name!" has invalid character " "'],
    ),
    _case(
        "name-leading-dash",
        HEAD + 'devices:\n  - name: "-x"\n    containerEdits: {env: [A=1]}\n',
        ['$.devices[0].name: device name "-x" must start with a letter or digit'],
    ),
    _case(
        "name-trailing-colon",
        HEAD + 'devices:\n  - name: "0:"\n    containerEdits: {env: [A=1]}\n',
        ['$.devices[0].name: device name "0:" must end with a letter or digit'],
    ),
    _case(
        "name-empty",
        HEAD + 'devices:\n  - name: ""\n    containerEdits: {env: [A=1]}\n',
        ["$.devices[0].name: must not be empty"],
    ),
    _case(
        "name-unquoted-int",
        HEAD + "devices:\n  - name: 0\n    containerEdits: {env: [A=1]}\n",
        ["$.devices[0].name: must be a string, got an integer"],
    ),
    _case(
        "name-missing",
        HEAD + "devices:\n  - containerEdits: {env: [A=1]}\n",
        ["$.devices[0].name: required field is missing"],
    ),
    # --- env
    _case(
        "env-no-equals",
        HEAD + 'devices:\n  - name: "0"\n    containerEdits:\n      env: [A=1, FOO]\n',
        ['$.devices[0].containerEdits.env[1]: env entry "FOO" must be NAME=VALUE'],
    ),
    _case(
        "env-empty-name",
        HEAD + DEV0 + 'containerEdits:\n  env: ["=x"]\n',
        ['$.containerEdits.env[0]: env entry "=x" must be NAME=VALUE'],
    ),
    _case(
        "env-not-string",
        HEAD + DEV0 + "containerEdits:\n  env: [1]\n",
        ["$.containerEdits.env[0]: must be a string, got an integer"],
    ),
    _case(
        "hook-env-bad",
        HEAD + DEV0 + "containerEdits:\n  hooks:\n    - hookName: prestart\n"
        "      path: /bin/true\n      env: [NOEQUALS]\n",
        ['$.containerEdits.hooks[0].env[0]: env entry "NOEQUALS" must be NAME=VALUE'],
    ),
    # --- devices list
    _case(
        "duplicate-devices",
        HEAD + 'devices:\n  - name: "0"\n    containerEdits: {env: [A=1]}\n'
        '  - name: "0"\n    containerEdits: {env: [B=1]}\n',
        ['$.devices[1].name: duplicate device name "0" (also $.devices[0])'],
        schema=False,
    ),
    _case(
        "empty-device-edits",
        HEAD + 'devices:\n  - name: "x"\n    containerEdits: {}\n',
        ['$.devices[0].containerEdits: device "x" has empty containerEdits'],
    ),
    _case(
        "device-edits-empty-lists",
        HEAD + 'devices:\n  - name: "x"\n    containerEdits:\n      env: []\n      mounts: []\n',
        ['$.devices[0].containerEdits: device "x" has empty containerEdits'],
        schema=False,
    ),
    _case(
        "device-edits-null",
        HEAD + 'devices:\n  - name: "x"\n    containerEdits: null\n',
        ['$.devices[0].containerEdits: device "x" has empty containerEdits'],
    ),
    _case(
        "device-edits-missing",
        HEAD + 'devices:\n  - name: "x"\n',
        ["$.devices[0].containerEdits: required field is missing"],
    ),
    _case(
        "zero-devices",
        HEAD + "devices: []\n",
        ["$.devices: no devices: a spec must define at least one"],
    ),
    _case("devices-missing", HEAD, ["$.devices: required field is missing"]),
    _case(
        "devices-mapping",
        HEAD + "devices: {name: x}\n",
        ["$.devices: must be a list, got a mapping"],
    ),
    _case(
        "device-not-mapping",
        HEAD + "devices: [gpu0]\n",
        ["$.devices[0]: must be a mapping, got a string"],
    ),
    # --- versions
    _case(
        "version-too-low-digit-name",
        'cdiVersion: "0.3.0"\nkind: nvidia.com/gpu\n' + DEV0,
        [
            '$.cdiVersion: cdiVersion "0.3.0" is too low: content requires 0.5.0 '
            '(device name "0" starts with a digit)'
        ],
        schema=False,
    ),
    _case(
        "version-too-low-mount-type",
        'cdiVersion: "0.3.0"\nkind: nvidia.com/gpu\n'
        "devices:\n  - name: gpu0\n    containerEdits:\n      mounts:\n"
        "        - {hostPath: /a, containerPath: /b, type: bind, options: [bind]}\n",
        [
            '$.cdiVersion: cdiVersion "0.3.0" is too low: content requires 0.4.0 '
            "($.devices[0].containerEdits.mounts has a type)"
        ],
        schema=False,
    ),
    _case(
        "version-too-low-annotations",
        HEAD + "annotations: {a: b}\n" + DEV0,
        [
            '$.cdiVersion: cdiVersion "0.5.0" is too low: content requires 0.6.0 '
            "($.annotations is set)"
        ],
        schema=False,
    ),
    _case(
        "version-too-low-gids",
        HEAD + DEV0 + "containerEdits:\n  additionalGids: [0]\n",
        [
            '$.cdiVersion: cdiVersion "0.5.0" is too low: content requires 0.7.0 '
            "($.containerEdits.additionalGids is set)"
        ],
        schema=False,
    ),
    _case(
        "version-too-low-netdevices",
        'cdiVersion: "1.0.0"\nkind: nvidia.com/net\n'
        "devices:\n  - name: eth\n    containerEdits:\n      netDevices:\n"
        "        - {hostInterfaceName: eth1, name: eth0}\n",
        [
            '$.cdiVersion: cdiVersion "1.0.0" is too low: content requires 1.1.0 '
            "($.devices[0].containerEdits.netDevices is set)"
        ],
        schema=False,
    ),
    _case(
        "version-unknown",
        'cdiVersion: "0.5.1"\nkind: nvidia.com/gpu\n' + DEV0,
        [f'$.cdiVersion: unknown cdiVersion "0.5.1": known versions are {ALL_VERSIONS}'],
    ),
    _case(
        "version-1.0.1",
        'cdiVersion: "1.0.1"\nkind: nvidia.com/gpu\n' + DEV0,
        [f'$.cdiVersion: unknown cdiVersion "1.0.1": known versions are {ALL_VERSIONS}'],
    ),
    _case(
        "version-0.2.0",
        'cdiVersion: "0.2.0"\nkind: nvidia.com/gpu\n'
        "devices:\n  - name: gpu\n    containerEdits: {env: [A=1]}\n",
        [
            '$.cdiVersion: cdiVersion "0.2.0" is too low: content requires 0.3.0 '
            "(the earliest supported version)"
        ],
        schema=False,
    ),
    _case(
        "version-missing",
        "kind: nvidia.com/gpu\n" + DEV0,
        ["$.cdiVersion: required field is missing"],
    ),
    _case(
        "version-float",
        "cdiVersion: 0.5\nkind: nvidia.com/gpu\n" + DEV0,
        ["$.cdiVersion: must be a string, got a number"],
    ),
    _case(
        "version-empty",
        'cdiVersion: ""\nkind: nvidia.com/gpu\n' + DEV0,
        ["$.cdiVersion: must not be empty"],
    ),
    # --- hooks
    _case(
        "hook-unknown-name",
        HEAD + DEV0 + "containerEdits:\n  hooks:\n    - {hookName: preStart, path: /bin/true}\n",
        [
            '$.containerEdits.hooks[0].hookName: unknown hook name "preStart": expected one of '
            "prestart, createRuntime, createContainer, startContainer, poststart, poststop"
        ],
    ),
    _case(
        "hook-empty-path",
        HEAD + DEV0 + 'containerEdits:\n  hooks:\n    - {hookName: poststop, path: ""}\n',
        ["$.containerEdits.hooks[0].path: must not be empty"],
    ),
    _case(
        "hook-relative-path",
        HEAD + DEV0 + "containerEdits:\n  hooks:\n"
        "    - {hookName: createContainer, path: nvshim, args: [nvshim, hook]}\n",
        ['$.containerEdits.hooks[0].path: hook path "nvshim" is not absolute'],
        schema=False,
    ),
    _case(
        "hook-timeout-string",
        HEAD + DEV0 + "containerEdits:\n  hooks:\n"
        '    - {hookName: poststop, path: /x, timeout: "5"}\n',
        ["$.containerEdits.hooks[0].timeout: must be an integer, got a string"],
    ),
    # --- device nodes
    _case(
        "node-bad-permissions",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n"
        "    - {path: /dev/nvidia0, permissions: rwx}\n",
        [
            '$.containerEdits.deviceNodes[0].permissions: permissions "rwx" may only contain '
            "the letters r, w and m"
        ],
    ),
    _case(
        "node-permissions-none",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n"
        "    - {path: /dev/nvidia0, permissions: none}\n",
        [
            '$.containerEdits.deviceNodes[0].permissions: permissions "none" may only contain '
            "the letters r, w and m"
        ],
    ),
    _case(
        "node-bad-type",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n    - {path: /dev/nvidia0, type: x}\n",
        ['$.containerEdits.deviceNodes[0].type: device type "x" is not one of b, c, u, p'],
    ),
    _case(
        "node-path-missing",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n    - {hostPath: /dev/nvidia0}\n",
        ["$.containerEdits.deviceNodes[0].path: required field is missing"],
    ),
    _case(
        "node-major-string",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n"
        '    - {path: /dev/nvidia0, type: c, major: "195", minor: 0}\n',
        ["$.containerEdits.deviceNodes[0].major: must be an integer, got a string"],
    ),
    _case(
        "node-major-outside-32-bits",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n"
        "    - {path: /dev/gpu1, type: c, major: 4294967491, minor: 1}\n",
        [
            "$.containerEdits.deviceNodes[0].major: 4294967491 is out of range 0..4294967295 "
            "(runc keeps the low 32 bits: it would use 195)"
        ],
        schema=False,
    ),
    _case(
        "node-minor-negative",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n"
        "    - {path: /dev/gpu1, type: c, major: 195, minor: -1}\n",
        [
            "$.containerEdits.deviceNodes[0].minor: -1 is out of range 0..4294967295 "
            "(runc keeps the low 32 bits: it would use 4294967295)"
        ],
        schema=False,
    ),
    _case(
        "node-uid-negative",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n    - {path: /dev/nvidia0, uid: -1}\n",
        ["$.containerEdits.deviceNodes[0].uid: -1 is out of range 0..4294967295"],
    ),
    _case(
        "node-relative-path",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n"
        "    - {path: dev/nvidia0, hostPath: /dev/nvidia0}\n",
        [
            '$.containerEdits.deviceNodes[0].path: container path "dev/nvidia0" is not absolute '
            '(did you mean "/dev/nvidia0"?)'
        ],
        schema=False,
    ),
    _case(
        "node-list-is-string",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes: /dev/nvidia0\n",
        ["$.containerEdits.deviceNodes: must be a list, got a string"],
    ),
    # --- mounts, gids, net, rdt, annotations
    _case(
        "mount-no-container-path",
        HEAD + DEV0 + "containerEdits:\n  mounts:\n    - {hostPath: /a, options: [ro, bind]}\n",
        ["$.containerEdits.mounts[0].containerPath: required field is missing"],
    ),
    _case(
        "mount-relative-container-path",
        HEAD + DEV0 + "containerEdits:\n  mounts:\n"
        "    - {hostPath: /usr/lib/libcuda.so.1, containerPath: usr/lib/libcuda.so.1}\n",
        [
            '$.containerEdits.mounts[0].containerPath: container path "usr/lib/libcuda.so.1" '
            'is not absolute (did you mean "/usr/lib/libcuda.so.1"?)'
        ],
        schema=False,
    ),
    _case(
        "mount-options-string",
        HEAD + DEV0 + "containerEdits:\n  mounts:\n"
        "    - {hostPath: /a, containerPath: /a, options: ro}\n",
        ["$.containerEdits.mounts[0].options: must be a list, got a string"],
    ),
    _case(
        "gid-negative",
        'cdiVersion: "0.7.0"\nkind: nvidia.com/gpu\n'
        + DEV0
        + "containerEdits:\n  additionalGids: [-1]\n",
        ["$.containerEdits.additionalGids[0]: -1 is out of range 0..4294967295"],
    ),
    _case(
        "netdevice-duplicate-name",
        'cdiVersion: "1.1.0"\nkind: nvidia.com/net\n'
        "devices:\n  - name: eth\n    containerEdits:\n      netDevices:\n"
        "        - {hostInterfaceName: eth1, name: eth0}\n"
        "        - {hostInterfaceName: eth2, name: eth0}\n",
        [
            '$.devices[0].containerEdits.netDevices[1].name: duplicate name "eth0" '
            "(also $.devices[0].containerEdits.netDevices[0])"
        ],
        schema=False,
    ),
    _case(
        "rdt-bad-closid",
        'cdiVersion: "0.7.0"\nkind: nvidia.com/gpu\n'
        + DEV0
        + 'containerEdits:\n  intelRdt: {closID: ".."}\n',
        ['$.containerEdits.intelRdt.closID: invalid closID ".."'],
        schema=False,
    ),
    _case(
        "annotation-not-string",
        'cdiVersion: "0.6.0"\nkind: nvidia.com/gpu\nannotations: {enabled: true}\n' + DEV0,
        ["$.annotations.enabled: must be a string, got a boolean"],
    ),
    # --- unknown fields
    _case("unknown-top-field", HEAD + DEV0 + "extra: 1\n", ['$.extra: unknown field "extra"']),
    _case(
        "unknown-field-case",
        'cdiVersion: "0.7.0"\nkind: nvidia.com/gpu\n'
        + DEV0
        + "containerEdits:\n  additionalGIDs: [5]\n",
        [
            '$.containerEdits.additionalGIDs: unknown field "additionalGIDs" '
            '(did you mean "additionalGids"?)'
        ],
    ),
    _case(
        "unknown-node-field",
        HEAD + DEV0 + "containerEdits:\n  deviceNodes:\n    - {path: /dev/nvidia0, mode: 438}\n",
        ['$.containerEdits.deviceNodes[0].mode: unknown field "mode"'],
    ),
    # --- decoding
    _case(
        "yaml-syntax",
        'cdiVersion: "0.5.0"\nkind: [nvidia.com/gpu\n',
        [
            "$: invalid YAML at line 3, column 1: while parsing a flow sequence: expected ',' "
            "or ']', but got '<stream end>'"
        ],
        schema=False,
    ),
    _case(
        "yaml-duplicate-key",
        HEAD + "kind: other.com/gpu\n" + DEV0,
        ['$: invalid YAML at line 3, column 1: duplicate key "kind"'],
        schema=False,
    ),
    _case(
        "yaml-duplicate-nested-key",
        HEAD + 'devices:\n  - name: "0"\n    name: "1"\n    containerEdits: {env: [A=1]}\n',
        ['$: invalid YAML at line 5, column 5: duplicate key "name"'],
        schema=False,
    ),
    _case(
        "yaml-list-document",
        "- cdiVersion: 0.5.0\n",
        ["$: top level must be a mapping, got a list"],
        schema=False,
    ),
    _case(
        "yaml-scalar-document",
        "just text\n",
        ["$: top level must be a mapping, got a string"],
        schema=False,
    ),
    _case("yaml-empty-file", "", ["$: empty document"], schema=False),
    _case("yaml-null-document", "---\n...\n", ["$: empty document"], schema=False),
    _case(
        "yaml-two-documents",
        HEAD + DEV0 + "---\n" + HEAD + DEV0,
        [
            "$: invalid YAML at line 7, column 1: expected a single document in the stream: "
            "but found another document"
        ],
        schema=False,
    ),
    _case(
        "json-syntax",
        '{"cdiVersion": "0.5.0",\n "kind": }',
        ["$: invalid JSON at line 2, column 10: Expecting value"],
        ext="json",
        schema=False,
    ),
    _case(
        "json-duplicate-key",
        '{"cdiVersion": "0.5.0", "kind": "a/b", "kind": "a/c"}',
        ['$: invalid JSON: duplicate key "kind"'],
        ext="json",
        schema=False,
    ),
    _case(
        "json-nan",
        '{"cdiVersion": "0.5.0", "kind": "a/b", "devices": NaN}',
        ["$: invalid JSON: NaN is not valid JSON"],
        ext="json",
        schema=False,
    ),
    _case("json-null", "null", ["$: empty document"], ext="json", schema=False),
    _case("json-whitespace", "  \n", ["$: empty document"], ext="json", schema=False),
    _case(
        "json-array", "[]", ["$: top level must be a mapping, got a list"], ext="json", schema=False
    ),
    _case(
        "yml-extension",
        HEAD + DEV0,
        ['$: unknown extension ".yml": CDI spec files end in .json or .yaml'],
        ext="yml",
        schema=False,
    ),
    # --- several problems in one file, in check order
    _case(
        "several",
        'cdiVersion: "0.3.0"\nkind: nvidia.com/gpu\nbogus: 1\n'
        'devices:\n  - name: "0"\n    containerEdits:\n      env: [FOO]\n'
        '  - name: "0"\n    containerEdits: {}\n',
        [
            '$.bogus: unknown field "bogus"',
            '$.cdiVersion: cdiVersion "0.3.0" is too low: content requires 0.5.0 '
            '(device name "0" starts with a digit)',
            '$.devices[0].containerEdits.env[0]: env entry "FOO" must be NAME=VALUE',
            '$.devices[1].name: duplicate device name "0" (also $.devices[0])',
            '$.devices[1].containerEdits: device "0" has empty containerEdits',
        ],
    ),
]


def _write(tmp_path: Path, ext: str, text: str, name: str = "spec") -> Path:
    path = tmp_path / f"{name}.{ext}"
    path.write_text(text, encoding="utf-8")
    return path


def _decoded(ext: str, text: str) -> Optional[Dict[str, Any]]:
    """The document as a mapping if it decodes to one, else None."""
    try:
        raw = json.loads(text) if ext == "json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError):
        return None
    return raw if isinstance(raw, dict) else None


@pytest.mark.parametrize("ext,text,expected,schema", INVALID)
def test_invalid_spec_file_gives_exact_problems(
    tmp_path: Path, ext: str, text: str, expected: List[str], schema: bool
) -> None:
    """Each invalid file yields exactly the expected one-line problems, prefixed by its path."""
    path = _write(tmp_path, ext, text)
    problems = validate_file(str(path))
    assert [str(p) for p in problems] == [f"{path}: {line}" for line in expected]
    assert all("\n" not in str(p) for p in problems)


@pytest.mark.parametrize("ext,text,expected,schema", INVALID)
def test_invalid_spec_file_fails_to_load(
    tmp_path: Path, ext: str, text: str, expected: List[str], schema: bool
) -> None:
    """load_spec_file rejects each invalid file with a CdiError whose text is the first problem."""
    path = _write(tmp_path, ext, text)
    with pytest.raises(CdiError) as info:
        load_spec_file(str(path))
    assert str(info.value).startswith(f"{path}: {expected[0]}")


@pytest.mark.parametrize("ext,text,expected,schema", [case for case in INVALID if case.values[3]])
def test_schema_alone_flags_the_same_place(
    ext: str, text: str, expected: List[str], schema: bool
) -> None:
    """The JSON schema, used on its own, reports a problem at the same JSON path."""
    raw = _decoded(ext, text)
    assert raw is not None
    json_path = expected[0].split(": ", 1)[0]
    assert json_path in {p.json_path for p in check_schema(raw, "x")}


def test_invalid_cases_are_many() -> None:
    """The table keeps at least thirty distinct invalid specs."""
    assert len({case.id for case in INVALID}) == len(INVALID) >= 30


LAB_SPEC = """\
cdiVersion: "0.5.0"
kind: "nvidia.com/gpu"
devices:
  - name: "0"
    containerEdits:
      deviceNodes:
        - path: /dev/nvidia0
          hostPath: /lab/fakedrv/dev/nvidia0
          type: c
          major: 195
          minor: 0
          permissions: rw
containerEdits:
  env:
    - FOO=bar
    - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
    - path: /dev/nvidiactl
      hostPath: /lab/fakedrv/dev/nvidiactl
  mounts:
    - hostPath: /lab/fakedrv/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
      containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
      options: ["ro", "nosuid", "nodev", "bind"]
  hooks:
    - hookName: createContainer
      path: /lab/hooks/hook.sh
      args: ["hook.sh", "cdi-createContainer"]
"""

FULL_SPEC = {
    "cdiVersion": "1.1.0",
    "kind": "example.com/net.card",
    "annotations": {"example.com/owner": "lab"},
    "devices": [
        {
            "name": "eth-0:1",
            "annotations": {"note": "x"},
            "containerEdits": {
                "netDevices": [{"hostInterfaceName": "eth1", "name": "eth0"}],
                "intelRdt": {"closID": "/", "schemata": ["L3:0=f"], "enableMonitoring": True},
            },
        },
        {"name": "rdt", "containerEdits": {"intelRdt": {}}},
    ],
    "containerEdits": {
        "env": ["A=", "B=c=d"],
        "additionalGids": [0, 44],
        "deviceNodes": [
            {"path": "/dev/pipe", "type": "p"},
            {
                "path": "/dev/x",
                "type": "b",
                "major": 8,
                "minor": 0,
                "fileMode": 438,
                "permissions": "",
                "uid": 0,
                "gid": 0,
            },
        ],
        "mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "tmpfs"}],
        "hooks": [
            {"hookName": "prestart", "path": "/bin/true", "args": [], "env": [], "timeout": 5}
        ],
    },
}

VALID = [
    pytest.param("yaml", HEAD + DEV0, id="minimal"),
    pytest.param("yaml", LAB_SPEC, id="engines-md-podman-example"),
    pytest.param("json", json.dumps(FULL_SPEC), id="every-field-1.1.0"),
    pytest.param("yaml", 'cdiVersion: "v0.5.0"\nkind: n/g\n' + DEV0, id="v-prefixed-version"),
    pytest.param("yaml", 'cdiVersion: "1.1.0"\nkind: n/g\n' + DEV0, id="newer-than-needed"),
    pytest.param(
        "yaml",
        HEAD + 'devices:\n  - name: "0"\n    annotations: null\n'
        "    containerEdits:\n      env: [A=1]\n      mounts: null\n"
        "containerEdits: null\n",
        id="nulls-mean-absent",
    ),
    pytest.param(
        "yaml",
        'cdiVersion: "0.3.0"\nkind: a/b\n'
        "devices:\n  - name: x\n    containerEdits: {env: [A=1]}\n"
        "containerEdits: {}\n",
        id="baseline-0.3.0-empty-spec-edits",
    ),
    pytest.param(
        "yaml",
        HEAD + 'devices:\n  - name: "0"\n    containerEdits: &common\n'
        '      env: [A=1]\n  - name: "1"\n    containerEdits:\n      <<: *common\n'
        "      env: [A=2]\n",
        id="yaml-merge-key-override",
    ),
]


@pytest.mark.parametrize("ext,text", VALID)
def test_valid_spec_has_no_problems_and_loads(tmp_path: Path, ext: str, text: str) -> None:
    """Valid specs pass both layers and load into a Spec."""
    path = _write(tmp_path, ext, text)
    assert validate_file(str(path)) == []
    spec = load_spec_file(str(path))
    assert spec.path == str(path)
    assert spec.vendor and spec.class_ and spec.devices


def test_loaded_spec_models_edits() -> None:
    """The engines.md example loads with its spec-level and device edits as Edits values."""
    spec = parse_spec(yaml.safe_load(LAB_SPEC), "lab.yaml")
    assert (spec.kind, spec.vendor, spec.class_, spec.version) == (
        "nvidia.com/gpu",
        "nvidia.com",
        "gpu",
        "0.5.0",
    )
    assert [d.name for d in spec.devices] == ["0"]
    assert spec.devices[0].edits.device_nodes == (
        DeviceNode(
            path="/dev/nvidia0",
            host_path="/lab/fakedrv/dev/nvidia0",
            type="c",
            major=195,
            minor=0,
            permissions="rw",
        ),
    )
    assert spec.edits.env == ("FOO=bar", "NVIDIA_VISIBLE_DEVICES=void")
    assert spec.edits.hooks == (
        Hook("createContainer", "/lab/hooks/hook.sh", args=("hook.sh", "cdi-createContainer")),
    )


def test_missing_file_is_one_problem(tmp_path: Path) -> None:
    """A file that cannot be read is one problem naming the OS reason, not a traceback."""
    path = tmp_path / "gone.yaml"
    assert [str(p) for p in validate_file(str(path))] == [
        f"{path}: $: cannot read: No such file or directory"
    ]


def test_non_utf8_file_is_one_problem(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 are reported with their offset."""
    path = tmp_path / "bin.json"
    path.write_bytes(b'{"a": "\xff"}')
    assert [str(p) for p in validate_file(str(path))] == [
        f"{path}: $: not UTF-8 text: invalid byte at offset 7"
    ]


def test_problem_str_is_one_line() -> None:
    """A Problem prints as <file>: <json path>: <message> on one line, a newline escaped."""
    assert str(CdiProblem("a.yaml", "$.kind", "bad\nkind")) == "a.yaml: $.kind: bad\\nkind"


# --------------------------------------------------------------------------------------
# versions

REQUIRED_VERSION = [
    ({"kind": "a/b", "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}]}, "0.3.0"),
    ({"devices": [{"name": "x", "containerEdits": {"mounts": [{"type": "bind"}]}}]}, "0.4.0"),
    ({"devices": [{"name": "x", "containerEdits": {"mounts": [{"type": ""}]}}]}, "0.3.0"),
    ({"devices": [{"name": "0"}]}, "0.5.0"),
    ({"devices": [{"name": "gpu0"}]}, "0.3.0"),
    ({"containerEdits": {"deviceNodes": [{"path": "/a", "hostPath": "/b"}]}}, "0.5.0"),
    ({"containerEdits": {"deviceNodes": [{"path": "/a", "hostPath": ""}]}}, "0.3.0"),
    ({"kind": "a.com/b.c"}, "0.6.0"),
    ({"kind": "a.com/b"}, "0.3.0"),
    ({"annotations": {"k": "v"}}, "0.6.0"),
    ({"annotations": {}}, "0.3.0"),
    ({"devices": [{"name": "x", "annotations": {"k": "v"}}]}, "0.6.0"),
    ({"containerEdits": {"additionalGids": [0]}}, "0.7.0"),
    ({"containerEdits": {"additionalGids": []}}, "0.3.0"),
    ({"devices": [{"name": "x", "containerEdits": {"intelRdt": {}}}]}, "0.7.0"),
    ({"containerEdits": {"intelRdt": {"closID": "x", "enableMonitoring": False}}}, "0.7.0"),
    ({"containerEdits": {"intelRdt": {"enableMonitoring": True}}}, "1.1.0"),
    ({"containerEdits": {"intelRdt": {"schemata": []}}}, "1.1.0"),
    ({"devices": [{"name": "x", "containerEdits": {"netDevices": [{}]}}]}, "1.1.0"),
    ({"containerEdits": {"netDevices": []}}, "0.3.0"),
    ({"devices": "junk", "containerEdits": [1], "kind": 3}, "0.3.0"),
]


@pytest.mark.parametrize("spec,version", REQUIRED_VERSION)
def test_required_version_table(spec: Dict[str, Any], version: str) -> None:
    """Each feature bumps the minimum cdiVersion to the version that introduced it."""
    assert required_version(spec) == version


def test_known_versions() -> None:
    """KNOWN_VERSIONS lists the released spec versions newest first, 1.0.1 not among them."""
    assert KNOWN_VERSIONS[0] == CURRENT_VERSION == "1.1.0"
    assert "1.0.1" not in KNOWN_VERSIONS and "0.3.0" in KNOWN_VERSIONS
    keys = [tuple(map(int, v.split("."))) for v in KNOWN_VERSIONS]
    assert keys == sorted(keys, reverse=True)


# --------------------------------------------------------------------------------------
# qualified names

GOOD_NAMES = [
    ("nvidia.com/gpu=0", ("nvidia.com", "gpu", "0")),
    ("nvidia.com/gpu=all", ("nvidia.com", "gpu", "all")),
    ("nvidia.com/gpu=0:1", ("nvidia.com", "gpu", "0:1")),
    ("nvidia.com/gpu=GPU-3f2a1b00-aaaa-bbbb", ("nvidia.com", "gpu", "GPU-3f2a1b00-aaaa-bbbb")),
    ("foo.bar.baz/foo-bar123.B_az=x", ("foo.bar.baz", "foo-bar123.B_az", "x")),
    ("a/b=c", ("a", "b", "c")),
]

BAD_NAMES = [
    ("", "empty name"),
    ("/dev/nvidia0", "a device path, not <vendor>/<class>=<device>"),
    ("nvidia.com/gpu", 'missing "=": expected <vendor>/<class>=<device>'),
    ("gpu=0", 'missing "/": expected <vendor>/<class>=<device>'),
    ("nvidia.com/gpu=", "empty device name"),
    ("=0", 'missing "/": expected <vendor>/<class>=<device>'),
    ("/gpu=0", "a device path, not <vendor>/<class>=<device>"),
    ("nvidia.com/=0", "empty class name"),
    ("1nvidia.com/gpu=0", 'vendor name "1nvidia.com" must start with a letter'),
    ("nvidia.com/gpu/x=0", 'class name "gpu/x" has invalid character "/"'),
    ("a.com/b=c=d", 'device name "c=d" has invalid character "="'),
    ("nvidia.com/gpu=-0", 'device name "-0" must start with a letter or digit'),
    ("nvidia.com/gpu=0.", 'device name "0." must end with a letter or digit'),
    ("nvidia.com/gpü=0", 'class name "gpü" has invalid character "\\u00fc"'),
]


@pytest.mark.parametrize("name,parts", GOOD_NAMES)
def test_parse_qualified_name_accepts(name: str, parts: tuple) -> None:
    """Valid qualified names split at the first "=" and the first "/"."""
    assert parse_qualified_name(name) == parts
    assert is_qualified_name(name)


@pytest.mark.parametrize("name,reason", BAD_NAMES)
def test_parse_qualified_name_rejects(name: str, reason: str) -> None:
    """Invalid names raise CdiError naming the value and the reason."""
    with pytest.raises(CdiError) as info:
        parse_qualified_name(name)
    assert str(info.value) == f'invalid CDI device name "{name}": {reason}'
    assert not is_qualified_name(name)


@given(st.text(max_size=30))
def test_qualified_name_parse_agrees_with_predicate(text: str) -> None:
    """parse_qualified_name succeeds exactly when is_qualified_name is true, and round-trips."""
    if is_qualified_name(text):
        vendor, class_, device = parse_qualified_name(text)
        assert f"{vendor}/{class_}={device}" == text
    else:
        with pytest.raises(CdiError):
            parse_qualified_name(text)


# --------------------------------------------------------------------------------------
# schema file


def test_packaged_schema_is_the_repository_schema() -> None:
    """nvshim/data/cdi-schema.json is a byte-identical copy of cdi-specs/schema.json."""
    repo_copy = (REPO / "cdi-specs" / "schema.json").read_bytes()
    packaged = (REPO / "nvshim" / "data" / "cdi-schema.json").read_bytes()
    assert packaged == repo_copy


def test_schema_is_a_valid_json_schema() -> None:
    """The schema itself passes its metaschema."""
    import jsonschema

    schema = json.loads((REPO / "cdi-specs" / "schema.json").read_text())
    jsonschema.validators.validator_for(schema).check_schema(schema)
    assert os.path.samefile(schema_path(), REPO / "nvshim" / "data" / "cdi-schema.json")


def test_schema_reports_what_only_it_knows() -> None:
    """A problem found by the schema alone is kept, with jsonschema's message at its path."""
    raw = yaml.safe_load(HEAD + DEV0)
    assert check_schema(raw, "x") == []
    raw["devices"][0]["containerEdits"]["env"] = {"A": "1"}
    assert [str(p) for p in check_schema(raw, "x")] == [
        "x: $.devices[0].containerEdits.env: {'A': '1'} is not of type 'array', 'null'"
    ]


# --------------------------------------------------------------------------------------
# building and dumping


def _sample_edits() -> Edits:
    return Edits(
        device_nodes=(
            DeviceNode("/dev/nvidia0", host_path="/drv/dev/nvidia0", type="c", major=195, minor=0),
        ),
    )


def test_spec_to_dict_uses_minimum_version_and_order() -> None:
    """spec_to_dict writes the minimum cdiVersion and keys cdiVersion, kind, devices, containerEdits."""
    spec = spec_to_dict(
        "nvidia.com/gpu",
        [("0", _sample_edits())],
        Edits(
            env=("NVIDIA_VISIBLE_DEVICES=void",),
            mounts=(Mount("/a", "/a", options=("ro", "bind")),),
        ),
    )
    assert list(spec) == ["cdiVersion", "kind", "devices", "containerEdits"]
    assert spec["cdiVersion"] == "0.5.0"
    assert validate_spec(spec) == []


def test_spec_to_dict_omits_empty_spec_edits_and_honours_version() -> None:
    """Empty spec-level edits are left out; an explicit version is kept."""
    spec = spec_to_dict("a/b", [("x", Edits(env=("A=1",)))], Edits(), version="0.8.0")
    assert spec == {
        "cdiVersion": "0.8.0",
        "kind": "a/b",
        "devices": [{"name": "x", "containerEdits": {"env": ["A=1"]}}],
    }


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ("a/b", [("x", Edits())], Edits()),
            '<spec>: $.devices[0].containerEdits: device "x" has empty containerEdits',
        ),
        (
            ("a/b", [("0", Edits(env=("A=1",)))], Edits(), "0.3.0"),
            '<spec>: $.cdiVersion: cdiVersion "0.3.0" is too low: content requires 0.5.0 '
            '(device name "0" starts with a digit)',
        ),
        (
            ("nvidia", [("x", Edits(env=("A=1",)))], Edits()),
            '<spec>: $.kind: kind "nvidia" must be <vendor>/<class>, like nvidia.com/gpu',
        ),
    ],
)
def test_spec_to_dict_refuses_invalid_specs(args: tuple, message: str) -> None:
    """spec_to_dict never returns a spec that would not load."""
    with pytest.raises(CdiError) as info:
        spec_to_dict(*args)
    assert str(info.value) == message


def test_dump_yaml_is_stable_and_starts_with_document_marker() -> None:
    """YAML output starts with ---, quotes digit names, keeps key order and round-trips."""
    spec = spec_to_dict("nvidia.com/gpu", [("0", _sample_edits())], Edits(env=("A=1",)))
    text = dump_spec(spec, "yaml")
    assert text == (
        "---\n"
        "cdiVersion: 0.5.0\n"
        "kind: nvidia.com/gpu\n"
        "devices:\n"
        "- name: '0'\n"
        "  containerEdits:\n"
        "    deviceNodes:\n"
        "    - path: /dev/nvidia0\n"
        "      hostPath: /drv/dev/nvidia0\n"
        "      type: c\n"
        "      major: 195\n"
        "      minor: 0\n"
        "containerEdits:\n"
        "  env:\n"
        "  - A=1\n"
    )
    assert yaml.safe_load(text) == spec
    assert dump_spec(dict(reversed(list(spec.items()))), "yaml") == text


def test_dump_json_round_trips() -> None:
    """JSON output parses back to the same document with the same key order."""
    spec = spec_to_dict("nvidia.com/gpu", [("0", _sample_edits())], Edits())
    text = dump_spec(spec, "json")
    assert text.endswith("}\n")
    assert json.loads(text) == spec
    assert list(json.loads(text)) == ["cdiVersion", "kind", "devices"]


@pytest.mark.parametrize("value", ["A=\x85", "A=\u2028b", "A=\u00e9", "A=\ttab", "A= lead"])
def test_dump_yaml_keeps_odd_characters(value: str) -> None:
    """YAML output keeps values with Unicode line breaks, accents and tabs byte-exact."""
    spec = spec_to_dict("a/b", [("x", Edits(env=(value,)))], Edits())
    assert yaml.safe_load(dump_spec(spec, "yaml")) == spec


def test_dump_unknown_format() -> None:
    """An unknown output format is a CdiError naming it."""
    with pytest.raises(CdiError, match='unknown spec format "toml": expected yaml or json'):
        dump_spec({}, "toml")


# --------------------------------------------------------------------------------------
# CLI

CLI_CASES = [
    "kind-no-slash",
    "duplicate-devices",
    "yaml-duplicate-key",
    "several",
    "version-too-low-digit-name",
    "json-syntax",
    "node-relative-path",
]


@pytest.mark.parametrize(
    "ext,text,expected,schema", [case for case in INVALID if case.id in CLI_CASES]
)
def test_cli_validate_prints_one_line_per_problem(
    tmp_path: Path, ext: str, text: str, expected: List[str], schema: bool
) -> None:
    """`cdi validate` prints each problem on one line, a summary on stderr, and exits 1."""
    path = _write(tmp_path, ext, text)
    result = CliRunner().invoke(cdi_group, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout.splitlines() == [f"{path}: {line}" for line in expected]
    problems = len(expected)
    assert result.stderr == f"1 file, {problems} problem{'s' if problems > 1 else ''}\n"


def test_cli_validate_good_files_print_only_summary(tmp_path: Path) -> None:
    """Good files print nothing on stdout; the summary counts files and problems; exit 0."""
    good = _write(tmp_path, "yaml", HEAD + DEV0, "good")
    lab = _write(tmp_path, "yaml", LAB_SPEC, "lab")
    result = CliRunner().invoke(cdi_group, ["validate", str(good), str(lab)])
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "2 files, 0 problems\n")


def test_cli_validate_mixed_files(tmp_path: Path) -> None:
    """Problems of several files are all listed and counted."""
    good = _write(tmp_path, "yaml", HEAD + DEV0, "good")
    bad = _write(tmp_path, "json", "[]", "bad")
    gone = tmp_path / "gone.yaml"
    result = CliRunner().invoke(cdi_group, ["validate", str(good), str(bad), str(gone)])
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"{bad}: $: top level must be a mapping, got a list",
        f"{gone}: $: cannot read: No such file or directory",
    ]
    assert result.stderr == "3 files, 2 problems\n"


def test_cli_validate_refuses_a_yaml_alias_bomb(tmp_path: Path) -> None:
    """Hook args made of nested YAML aliases (a few hundred bytes, 9**9 values): the schema
    check walked them and quoted them in its messages for good. Now one problem, quickly.
    In a subprocess, so a regression fails on the timeout instead of hanging the suite."""
    import subprocess
    import sys

    from nvshim.cdi.load import MAX_SPEC_VALUES

    parts = ["&a0 [l,l,l,l,l,l,l,l,l]"]
    parts += ["&a%d [%s]" % (i, ",".join(["*a%d" % (i - 1)] * 9)) for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text(
        'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n'
        "  containerEdits:\n    hooks:\n    - hookName: createContainer\n"
        "      path: /bin/true\n      args: [" + ", ".join(parts) + "]\n"
    )
    repo = str(Path(__file__).resolve().parents[3])
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from nvshim.cli.main import main; main(sys.argv[2:])",
            repo,
            "cdi",
            "validate",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 1
    assert out.stdout == (
        f"{path}: $: more than {MAX_SPEC_VALUES} values once YAML aliases are expanded\n"
    )


def test_cli_validate_needs_a_file() -> None:
    """`cdi validate` without files is a usage error (exit 2)."""
    result = CliRunner().invoke(cdi_group, ["validate"])
    assert result.exit_code == 2


@pytest.mark.parametrize("args", [["--help"], ["list", "--help"], ["validate", "--help"]])
def test_cli_help(args: List[str]) -> None:
    """Every cdi command has --help that exits 0."""
    result = CliRunner().invoke(cdi_group, args)
    assert result.exit_code == 0
    assert "Usage:" in result.stdout


# --------------------------------------------------------------------------------------
# properties

FIELD_NAMES = [
    "cdiVersion",
    "kind",
    "annotations",
    "devices",
    "containerEdits",
    "name",
    "env",
    "deviceNodes",
    "mounts",
    "hooks",
    "intelRdt",
    "additionalGids",
    "netDevices",
    "path",
    "hostPath",
    "type",
    "major",
    "minor",
    "fileMode",
    "permissions",
    "uid",
    "gid",
    "containerPath",
    "options",
    "hookName",
    "args",
    "timeout",
    "closID",
    "schemata",
    "enableMonitoring",
    "hostInterfaceName",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.sampled_from(
        ["0", "0.5.0", "v1.1.0", "nvidia.com/gpu", "A=1", "=", "c", "rw", "prestart", "/dev/x", ""]
    ),
)
keys = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=5))
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values)
def test_validate_spec_never_raises(raw: Any) -> None:
    """Any decoded value gives a list of Problems, never an exception."""
    problems = validate_spec(raw, "h.yaml")
    assert all(isinstance(p, CdiProblem) and "\n" not in str(p) for p in problems)
    if isinstance(raw, dict) and not problems:
        parse_spec(raw, "h.yaml")


def _edits_strategy() -> Any:
    text = st.text(alphabet="abc/=_.x01", min_size=1, max_size=6)
    absolute = text.map(lambda t: "/" + t)  # container and hook paths must be absolute
    env = st.builds(
        lambda k, v: f"{k}={v}",
        st.text(alphabet="ABC_", min_size=1, max_size=4),
        st.text(max_size=4),
    )
    node = st.builds(
        DeviceNode,
        path=absolute,
        host_path=st.none() | text,
        type=st.sampled_from([None, "c", "b", "p", "u"]),
        major=st.none() | st.integers(0, 300),
        minor=st.none() | st.integers(0, 300),
        permissions=st.sampled_from([None, "rw", "rwm", "m"]),
    )
    mount = st.builds(
        Mount,
        host_path=text,
        container_path=absolute,
        type=st.sampled_from([None, "bind", "tmpfs"]),
        options=st.lists(text, max_size=3).map(tuple),
    )
    hook = st.builds(
        Hook,
        hook_name=st.sampled_from(["prestart", "createContainer", "poststop"]),
        path=absolute,
        args=st.lists(text, max_size=2).map(tuple),
        env=st.lists(env, max_size=2).map(tuple),
    )
    return st.builds(
        Edits,
        env=st.lists(env, max_size=3).map(tuple),
        device_nodes=st.lists(node, max_size=2).map(tuple),
        mounts=st.lists(mount, max_size=2).map(tuple),
        hooks=st.lists(hook, max_size=2).map(tuple),
        additional_gids=st.lists(st.integers(0, 2**32 - 1), max_size=2).map(tuple),
    )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["0", "1", "all", "gpu0", "0:1"]), _edits_strategy()),
        min_size=1,
        max_size=3,
        unique_by=lambda t: t[0],
    ),
    _edits_strategy(),
    st.sampled_from(["yaml", "json"]),
)
def test_generated_specs_round_trip(devices: Any, edits: Edits, fmt: str) -> None:
    """Every spec spec_to_dict builds validates, dumps, and loads back to the same Edits."""
    devices = [(name, dev) for name, dev in devices if dev]
    if not devices:
        return
    spec = spec_to_dict("nvidia.com/gpu", devices, edits)
    assert validate_spec(spec) == []
    text = dump_spec(spec, fmt)
    raw = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    assert raw == spec
    loaded = parse_spec(raw, f"x.{fmt}")
    assert [(d.name, d.edits) for d in loaded.devices] == [
        (name, Edits.from_cdi(dev.to_cdi())) for name, dev in devices
    ]
