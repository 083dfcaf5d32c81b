"""The house rules docs/architecture.md states, held for the whole package: a module over
400 lines says why it is one module, and each default has one owner in nvshim/."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Set, Tuple

import yaml

from nvshim import config
from nvshim.agent import AGENT_SOCKET, NRI_SOCKET
from nvshim.node.install import prefix
from nvshim.runtime.claim import DEVICE_LIST_DIR
from tests.unit.test_unreferenced import docstrings

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "nvshim"
#: Over this many lines a module's docstring says why it is one module.
MAX_LINES = 400
#: The paragraph that says it (docs/architecture.md, "Rules of the house").
MARKER = "Why one module:"

#: default literal -> (its owner, the owner's value). The owner is the one module of
#: nvshim/ whose code spells the literal; everything else imports it.
FACTS: Dict[str, Tuple[str, Callable[[], object]]] = {
    "/etc/nvshim/config.yaml": ("nvshim/config.py", lambda: config.DEFAULT_CONFIG_PATH),
    "/run/nvshim/agent.sock": ("nvshim/agent/__init__.py", lambda: AGENT_SOCKET),
    "/var/run/nri/nri.sock": ("nvshim/agent/__init__.py", lambda: NRI_SOCKET),
    "/etc/cdi": ("nvshim/config.py", lambda: config.DEFAULT_CDI_SPEC_DIRS[0]),
    "/var/run/cdi": ("nvshim/config.py", lambda: config.DEFAULT_CDI_SPEC_DIRS[1]),
    "/var/lib/kubelet/pod-resources/kubelet.sock": (
        "nvshim/config.py",
        lambda: config.Config().kubelet_socket,
    ),
    "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint": (
        "nvshim/config.py",
        lambda: config.Config().kubelet_checkpoint,
    ),
    "/var/lib/nvshim/grants.jsonl": ("nvshim/config.py", lambda: config.Config().grants_journal),
    "/run/containerd/runc/k8s.io": ("nvshim/config.py", lambda: config.Config().nri_runtime_root),
    "/var/run/nvidia-container-devices": ("nvshim/runtime/claim.py", lambda: DEVICE_LIST_DIR),
    "/usr/local/bin/nvshim-runtime": (
        "nvshim/node/install/prefix.py",
        lambda: prefix.DEFAULT_RUNTIME_PATH,
    ),
}


def _modules() -> Iterator[Tuple[str, str]]:
    """(repository path, source) of every hand-written module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name.endswith("_pb2.py"):  # generated from a .proto, never edited
            continue
        yield path.relative_to(REPO).as_posix(), path.read_text()


def _says_why(source: str) -> bool:
    doc = ast.get_docstring(ast.parse(source)) or ""
    return any(paragraph.startswith(MARKER) for paragraph in doc.split("\n\n"))


def _code_strings(source: str) -> Iterator[str]:
    """The string constants of ``source`` that are code: docstrings left out."""
    tree = ast.parse(source)
    docs = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.value


def test_every_module_over_the_limit_says_why_it_is_one() -> None:
    """A module over 400 lines has a docstring paragraph starting "Why one module:"."""
    silent: List[str] = []
    for name, source in _modules():
        if source.count("\n") > MAX_LINES and not _says_why(source):
            silent.append(name)
    assert not silent, (
        f"over {MAX_LINES} lines without a '{MARKER}' paragraph (split it "
        f"or say why): {', '.join(silent)}"
    )


def test_the_marker_reads_a_real_paragraph() -> None:
    """The check finds the paragraph where it is and misses it where it is not."""
    assert _says_why('"""Title.\n\nWhy one module: because.\n"""\n')
    assert not _says_why('"""Title.\n\nOne module on purpose: because.\n"""\n')
    assert not _says_why('"""Title. Why one module: in a sentence, not a paragraph."""\n')


def test_each_fact_has_the_value_its_owner_gives() -> None:
    """The table's literals are the owners' values (so a changed default updates the test)."""
    wrong = {literal: value() for literal, (_, value) in FACTS.items() if value() != literal}
    assert not wrong


def test_each_default_is_spelled_only_by_its_owner() -> None:
    """No module of nvshim/ but a default's owner spells it in code (docstrings may)."""
    copies: Set[Tuple[str, str]] = set()
    for name, source in _modules():
        strings = list(_code_strings(source))
        for literal, (owner, _) in FACTS.items():
            if name != owner and any(literal in text for text in strings):
                copies.add((literal, name))
    assert not copies, "import the owner's constant instead: " + "; ".join(
        f"{literal} in {name} (owner {FACTS[literal][0]})" for literal, name in sorted(copies)
    )


def test_the_owner_check_sees_code_and_not_docstrings() -> None:
    """A literal in a string of code counts, in a docstring or comment it does not."""
    source = (
        '"""Reads /etc/cdi."""\n# /etc/cdi\nX = f"{1}/etc/cdi"\ndef f():\n    """/var/run/cdi"""\n'
    )
    strings = list(_code_strings(source))
    assert any("/etc/cdi" in text for text in strings)
    assert not any("/var/run/cdi" in text for text in strings)


def _sh_default(text: str, variable: str) -> str:
    """The default of ``${VARIABLE:-default}`` in a shell script (the one spelling; an
    empty ``${VARIABLE:-}`` only asks whether it is set)."""
    found: Set[str] = set(re.findall(r"\$\{" + variable + r":-([^}]+)\}", text))
    assert len(found) == 1, f"{variable}: {sorted(found)}"
    return found.pop()


def test_the_installers_spell_the_defaults_as_nvshim_does() -> None:
    """install.sh and deploy/installer.sh, which cannot import nvshim, use its defaults."""
    install = (REPO / "install.sh").read_text()
    installer = (REPO / "deploy" / "installer.sh").read_text()
    for script in (install, installer):
        etcdir = _sh_default(script, "NVSHIM_ETCDIR")
        assert f"{etcdir}/config.yaml" == config.DEFAULT_CONFIG_PATH
        bindir = _sh_default(script, "NVSHIM_BINDIR")
        assert f"{bindir}/nvshim-runtime" == prefix.DEFAULT_RUNTIME_PATH
    assert _sh_default(install, "NVSHIM_KUBELET_SOCKET") == config.Config().kubelet_socket


def test_the_configmap_repeats_the_defaults_it_names() -> None:
    """deploy/configmap.yaml's CDI dirs, runtimes and driver root are config.py's defaults."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "configmap.yaml").read_text()) if d]
    (shipped,) = [
        yaml.safe_load(d["data"]["config.yaml"]) for d in docs if d.get("kind") == "ConfigMap"
    ]
    defaults = config.Config()
    assert tuple(shipped["cdi-spec-dirs"]) == defaults.cdi_spec_dirs
    assert tuple(shipped["runtimes"]) == defaults.runtimes
    assert shipped["driver-root"] == defaults.driver_root


def test_the_daemonset_mounts_the_config_directory_nvshim_reads() -> None:
    """The DaemonSet's hostPath for the config is the directory of DEFAULT_CONFIG_PATH."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "daemonset.yaml").read_text()) if d]
    (daemonset,) = [d for d in docs if d.get("kind") == "DaemonSet"]
    paths = {
        v["hostPath"]["path"]
        for v in daemonset["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    assert config.DEFAULT_CONFIG_PATH.rsplit("/", 1)[0] in paths
