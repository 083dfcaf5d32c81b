"""The Kubernetes manifests in deploy/ are valid and agree with each other and with nvshim."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Tuple

import kubernetes_validate
import pytest
import yaml

from nvshim.node import containerd

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


def test_daemonset_runs_on_gpu_nodes_where_runtimeclass_schedules() -> None:
    """The installer and the RuntimeClass target the same GPU nodes and tolerate the GPU taint."""
    pod = _one("DaemonSet", "nvshim-installer")["spec"]["template"]["spec"]
    scheduling = _one("RuntimeClass", "nvshim")["scheduling"]
    assert pod["nodeSelector"] == scheduling["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    taint = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert taint in pod["tolerations"] and taint in scheduling["tolerations"]


def test_daemonset_privilege_only_where_needed() -> None:
    """Only the install init container is privileged; the long-running one is not; images are the marked placeholder."""
    pod = _one("DaemonSet", "nvshim-installer")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    (install,) = pod["initContainers"]
    assert install["securityContext"]["privileged"] is True
    assert "install.sh --containerd" in install["args"][0]
    assert "nsenter -t 1" in install["args"][0]
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    for container in _containers(pod):
        assert container["resources"]["limits"]["memory"]
        assert container["image"] == "ghcr.io/example/nvshim:0.1.0"
    assert "PLACEHOLDER image" in (DEPLOY / "daemonset.yaml").read_text()


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
