"""The Kubernetes manifests in deploy/ are valid and agree with each other and with nvshim."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any, Dict, List, Tuple

import kubernetes_validate
import pytest
import yaml

from nvshim.agent import AGENT_SOCKET
from nvshim.node.engines import containerd
from nvshim.node.install.units import render_agent_service

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted(DEPLOY.rglob("*.yaml"))
# The oldest and the newest Kubernetes versions whose schemas kubernetes-validate ships.
VERSIONS = ("1.25.0", kubernetes_validate.latest_version())


def _docs(path: Path) -> List[Dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _all() -> List[Tuple[Path, Dict[str, Any]]]:
    return [(path, doc) for path in MANIFESTS for doc in _docs(path)]


def _one(kind: str, name: str) -> Dict[str, Any]:
    found = [doc for _, doc in _all() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def _containers(pod_spec: Dict[str, Any]) -> List[Dict[str, Any]]:
    return list(pod_spec.get("initContainers", [])) + list(pod_spec["containers"])


def test_manifest_set_is_complete() -> None:
    """deploy/ holds the namespace, ConfigMap, DaemonSet, RuntimeClass and both example pods."""
    names = {str(p.relative_to(DEPLOY)) for p in MANIFESTS}
    assert names == {
        "namespace.yaml",
        "configmap.yaml",
        "daemonset.yaml",
        "runtimeclass.yaml",
        "examples/pod-gpu.yaml",
        "examples/pod-no-gpu.yaml",
    }


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_manifest_is_valid_kubernetes(path: Path, version: str) -> None:
    """Every document validates strictly (unknown fields fail) against the Kubernetes schema."""
    docs = _docs(path)
    assert docs, f"{path} has no documents"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_rejects_a_typo() -> None:
    """The validation above would catch a misspelt field (so the test can fail)."""
    doc = _one("RuntimeClass", "nvshim")
    broken = dict(doc, handlr=doc["handler"])
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)


def test_runtimeclass_handler_is_configure_default_name() -> None:
    """The RuntimeClass handler equals the handler name `nvshim runtime configure` writes by default."""
    assert _one("RuntimeClass", "nvshim")["handler"] == containerd.DEFAULT_NAME


def test_examples_use_the_runtimeclass() -> None:
    """Both example pods select the RuntimeClass; only the GPU one requests nvidia.com/gpu."""
    gpu = _one("Pod", "nvshim-gpu-example")["spec"]
    no_gpu = _one("Pod", "nvshim-no-gpu-example")["spec"]
    assert gpu["runtimeClassName"] == no_gpu["runtimeClassName"] == "nvshim"
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    for container in no_gpu["containers"]:
        resources = container.get("resources", {})
        for section in ("limits", "requests"):
            assert "nvidia.com/gpu" not in resources.get(section, {})


def _installer_defaults() -> Dict[str, str]:
    """``NVSHIM_X`` → its default in deploy/installer.sh (``VAR=${NVSHIM_X:-default}``)."""
    text = (DEPLOY / "installer.sh").read_text()
    return {
        m.group(1): m.group(2)
        for m in re.finditer(r"^[A-Z_]+=\$\{(NVSHIM_[A-Z_]+):?-([^}]*)\}", text, re.M)
    }


def _installer_pod() -> Dict[str, Any]:
    return dict(_one("DaemonSet", "nvshim-installer")["spec"]["template"]["spec"])


def _container(pod: Dict[str, Any], name: str) -> Dict[str, Any]:
    (found,) = [c for c in pod["containers"] if c["name"] == name]
    return dict(found)


def test_daemonset_runs_the_node_agent_in_the_nodes_mount_namespace() -> None:
    """A second container runs `nvshim agent` as installed on the node (in the installer's
    bin dir), entered into the node's mount namespace (the agent serves only creates that
    resolve paths as it does), its NRI plugin opt-in through NVSHIM_NRI_SOCKET (none by
    default, the node's NRI socket documented), and is ready when `nvshim agent --ready` says so."""
    agent = _container(_installer_pod(), "agent")
    script = " ".join(agent["args"])
    assert 'nsenter -t 1 -m -u -i -n -- "$bindir/nvshim" agent --wait' in script
    assert '--config "$etcdir/config.yaml"' in script
    assert '--nri-socket "$NVSHIM_NRI_SOCKET"' in script
    assert f"--socket {AGENT_SOCKET}" in script
    assert {e["name"]: e["value"] for e in agent["env"]}["NVSHIM_NRI_SOCKET"] == "none"
    readme = (DEPLOY / "README.md").read_text()
    assert "`NVSHIM_NRI_SOCKET`" in readme and "/var/run/nri/nri.sock" in readme
    probe = agent["readinessProbe"]["exec"]["command"]
    assert probe[:5] == ["nsenter", "-t", "1", "-m", "--"]  # the node's file, the node's nvshim
    assert probe[-1].endswith(f'"$b/nvshim" agent --socket {AGENT_SOCKET} --ready')
    # the command where the installer container put it (a moved bin dir: read-only /usr),
    # read from the node-paths file the installer writes on the node (one setting)
    assert "NVSHIM_BINDIR" not in {e["name"] for e in agent["env"]}
    assert "nsenter -t 1 -m -- cat /run/nvshim/node-paths" in script
    installer_sh = (DEPLOY / "installer.sh").read_text()
    assert "NODE_PATHS=${NVSHIM_NODE_PATHS:-/run/nvshim/node-paths}" in installer_sh
    assert 'sh "$NODE_PATHS" "$BINDIR" "$ETCDIR"' in installer_sh
    assert agent["securityContext"]["privileged"] is True
    assert agent["image"] == _container(_installer_pod(), "installer")["image"]


def _matches(term: Dict[str, Any], labels: Dict[str, str]) -> bool:
    """One nodeSelectorTerm (In / NotIn expressions, ANDed) against a node's labels."""
    for expr in term["matchExpressions"]:
        present = expr["key"] in labels and labels[expr["key"]] in expr["values"]
        if (expr["operator"] == "In") != present:
            return False
    return True


def _schedules_on(labels: Dict[str, str]) -> bool:
    terms = _installer_pod()["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {e["operator"] for t in terms for e in t["matchExpressions"]} <= {"In", "NotIn"}
    return any(_matches(term, labels) for term in terms)  # terms are ORed


@pytest.mark.parametrize(
    "labels, scheduled",
    [
        ({"nvidia.com/gpu.present": "true"}, True),
        ({"feature.node.kubernetes.io/pci-10de.present": "true"}, True),
        ({"nvshim.io/install": "true"}, True),
        ({"nvidia.com/gpu.present": "true", "nvshim.io/install": "false"}, False),
        (
            {"feature.node.kubernetes.io/pci-10de.present": "true", "nvshim.io/install": "false"},
            False,
        ),
        ({"nvidia.com/gpu.present": "false"}, False),
        ({}, False),
    ],
)
def test_daemonset_schedules_by_gfd_nfd_or_a_plain_label(
    labels: Dict[str, str], scheduled: bool
) -> None:
    """The installer lands on nodes GFD, NFD or a hand-set nvshim.io/install=true marks as
    GPU nodes, without needing GFD or NFD, and never where nvshim.io/install=false."""
    assert "nodeSelector" not in _installer_pod()
    assert _schedules_on(labels) is scheduled


def test_runtimeclass_nodes_get_the_installer() -> None:
    """Every node the RuntimeClass sends pods to runs the installer, and both tolerate the
    GPU taint."""
    scheduling = _one("RuntimeClass", "nvshim")["scheduling"]
    assert _schedules_on(dict(scheduling["nodeSelector"]))
    taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert taint in _installer_pod()["tolerations"] and taint in scheduling["tolerations"]


def test_daemonset_runs_the_installer_entrypoint_privileged_with_the_ci_image() -> None:
    """One long-running privileged hostPID container runs deploy/installer.sh from the image CI
    builds (no placeholder registry left), ready only once installed, with time to uninstall."""
    pod = _installer_pod()
    assert pod["hostPID"] is True and "initContainers" not in pod
    installer = _container(pod, "installer")
    assert [c["name"] for c in pod["containers"]] == ["installer", "agent"]
    assert installer["securityContext"]["privileged"] is True
    assert installer["command"] == ["/bin/sh", "/usr/local/bin/nvshim-installer"]
    assert installer["image"] == "localhost/nvshim-installer:0.1.0"
    assert installer["resources"]["limits"]["memory"]
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            assert "ghcr.io/example" not in path.read_text(), path
    defaults = _installer_defaults()
    assert installer["readinessProbe"]["exec"]["command"] == [
        "test",
        "-e",
        defaults["NVSHIM_READY_FILE"],
    ]
    env = {e["name"]: e["value"] for e in installer["env"]}
    timeout = int(env.get("NVSHIM_RESTART_TIMEOUT", "60"))
    # an install in flight (two restart waits when containerd does not come back), then the
    # uninstall's restart wait
    assert pod["terminationGracePeriodSeconds"] >= 3 * timeout + 60


def test_daemonset_env_names_settings_the_installer_reads() -> None:
    """Every NVSHIM_* variable the DaemonSet sets is read by installer.sh (or passed on to
    install.sh, which reads it) and documented in deploy/README.md: a typo cannot hide."""
    installer = _container(_installer_pod(), "installer")
    entrypoint = (DEPLOY / "installer.sh").read_text()
    install_sh = (DEPLOY.parent / "install.sh").read_text()
    readme = (DEPLOY / "README.md").read_text()
    for name in (e["name"] for e in installer["env"]):
        assert name in entrypoint, name
        assert name in _installer_defaults() or f"${{{name}" in install_sh, name
        assert f"`{name}`" in readme, name


def test_daemonset_mounts_where_the_installer_looks() -> None:
    """The hostPath, ConfigMap and state mounts sit where installer.sh's defaults expect them:
    the node's stage and /etc/nvshim under /host, the ConfigMap's file, the ready file."""
    pod = _installer_pod()
    installer = _container(pod, "installer")
    defaults = _installer_defaults()
    mounts = {m["name"]: m["mountPath"] for m in installer["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    host = defaults["NVSHIM_HOST_ROOT"]
    assert host == "/host"
    stage_dir = posixpath.dirname(defaults["NVSHIM_STAGE"])
    for name, node_path in (
        ("host-stage", stage_dir),
        ("host-etc-nvshim", defaults["NVSHIM_ETCDIR"]),
    ):
        assert volumes[name]["hostPath"]["path"] == node_path
        assert mounts[name] == host + node_path
    assert mounts["config"] == posixpath.dirname(defaults["NVSHIM_CONFIGMAP_FILE"])
    assert volumes["config"]["configMap"]["name"] == "nvshim-config"
    assert mounts["state"] == posixpath.dirname(defaults["NVSHIM_READY_FILE"])
    assert "emptyDir" in volumes["state"]


def test_namespaced_objects_live_in_the_namespace() -> None:
    """The installer's objects are in nvshim-system, which allows privileged pods."""
    namespace = _one("Namespace", "nvshim-system")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for kind, name in (("DaemonSet", "nvshim-installer"), ("ConfigMap", "nvshim-config")):
        assert _one(kind, name)["metadata"]["namespace"] == "nvshim-system"


def test_configmap_is_a_valid_nvshim_config_with_require_allocation() -> None:
    """The node config passes nvshim's own validation and turns require-allocation on."""
    config_module = pytest.importorskip("nvshim.config")
    configmap = _one("ConfigMap", "nvshim-config")
    volumes = _one("DaemonSet", "nvshim-installer")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "nvshim-config"}} in volumes
    text = configmap["data"]["config.yaml"]
    config = config_module.parse_config_text(text.encode(), "deploy/configmap.yaml")
    assert config.require_allocation is True
    assert config.verify_with == "kubelet" and config.kubelet_unreachable == "fail"


def test_configmap_ships_the_device_plugin_management_pods_entry_commented() -> None:
    """configmap.yaml carries the NVIDIA device plugin's management-pods entry commented out
    (uncommented it is valid and names the plugin's pods), and deploy/README.md documents
    the key."""
    config_module = pytest.importorskip("nvshim.config")
    text = _one("ConfigMap", "nvshim-config")["data"]["config.yaml"]
    commented = [
        line for line in text.splitlines() if line.lstrip().startswith("# management-pods:")
    ]
    assert len(commented) == 1, text
    entry = commented[0].lstrip()[2:]
    config = config_module.parse_config_text((text + entry + "\n").encode(), "configmap")
    assert config.management_pods == ("kube-system/nvidia-device-plugin-*",)
    assert config_module.parse_config_text(text.encode(), "configmap").management_pods == ()
    assert "`management-pods`" in (DEPLOY / "README.md").read_text()


def test_bin_dir_is_a_documented_daemonset_setting() -> None:
    """NVSHIM_BINDIR (read-only /usr nodes) is set in the DaemonSet's env, passed on by the
    installer, documented in deploy/README.md (set once: the agent container reads the
    installer's node-paths file) and supported by
    install.sh's --help."""
    installer = _container(_installer_pod(), "installer")
    env = {e["name"]: e["value"] for e in installer["env"]}
    assert env["NVSHIM_BINDIR"] == "/usr/local/bin"
    assert "NVSHIM_BINDIR" in (DEPLOY / "installer.sh").read_text().split("PASS=")[1][:80]
    help_text = (DEPLOY.parent / "install.sh").read_text().split("\nset -eu")[0]
    assert "for testing" not in help_text and "read-only" in help_text
    section = (DEPLOY / "README.md").read_text().split("## Nodes with a read-only `/usr`")[1]
    assert "the setting is made once" in section.split("\n## ")[0]


def test_containerfile_build_args_have_defaults_and_the_build_flags_are_documented() -> None:
    """The builder's PIP_* build arguments have empty defaults (no "missing build argument"
    warnings), and the Containerfile and deploy/README.md give the podman flags the tests
    build with (--isolation=chroot --network=host)."""
    containerfile = (DEPLOY / "Containerfile").read_text()
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CERT"):
        assert f"ARG {name}=\n" in containerfile, name
    for text in (containerfile, (DEPLOY / "README.md").read_text()):
        assert "--isolation=chroot --network=host" in text


def test_enable_nri_is_an_installer_setting_passed_as_install_sh_nri() -> None:
    """NVSHIM_ENABLE_NRI (off by default) makes the installer run install.sh with --nri (containerd 1.7's NRI on through the same drop-in) and is documented."""
    installer = _container(_installer_pod(), "installer")
    assert {e["name"]: e["value"] for e in installer["env"]}["NVSHIM_ENABLE_NRI"] == "false"
    assert _installer_defaults()["NVSHIM_ENABLE_NRI"] == "false"
    text = (DEPLOY / "installer.sh").read_text()
    assert 'if [ "$ENABLE_NRI" = true ]; then set -- "$@" --nri; fi' in text
    assert "`NVSHIM_ENABLE_NRI`" in (DEPLOY / "README.md").read_text()


def _readme_builds() -> List[List[str]]:
    """Every ``podman build`` command of deploy/README.md, continuation lines joined."""
    import shlex

    text = re.sub(r"\\\n\s*", "", (DEPLOY / "README.md").read_text())
    return [shlex.split(m) for m in re.findall(r"^\s*(podman build [^\n]*)$", text, re.M)]


def test_readme_build_commands_are_the_ones_the_tests_run() -> None:
    """Each ``podman build`` in deploy/README.md is, flag for flag, the command
    tests/helpers/installer_image.py builds the DaemonSet's image with (its ``build_argv``),
    with or without the ``BASE`` build argument."""
    from tests.helpers.installer_image import build_argv

    builds = _readme_builds()
    assert len(builds) == 2, builds
    for argv in builds:
        name = argv[argv.index("-t") + 1]
        base = next((a.split("=", 1)[1] for a in argv if a.startswith("BASE=")), None)
        assert argv == build_argv(name, base), argv


def test_install_sh_unit_serves_the_agents_one_socket() -> None:
    """install.sh's nvshim-agent.service, rendered by nvshim.node.install.units, names the
    socket nvshim.agent.AGENT_SOCKET names, the one every other part uses; install.sh
    spells no socket of its own."""
    text = (DEPLOY.parent / "install.sh").read_text()
    assert 'render_unit "$AGENT_UNIT.service"' in text and AGENT_SOCKET not in text
    (line,) = [
        x for x in render_agent_service("/b", "/e").splitlines() if x.startswith("ExecStart=")
    ]
    assert f" --socket {AGENT_SOCKET} " in line
