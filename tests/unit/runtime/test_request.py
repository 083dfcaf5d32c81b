"""Tables for what a container claims and may get: request sources, require-allocation,
the image view of config.json, capabilities. The device-token grammar and GPU selection
are in test_devices.py."""

from __future__ import annotations

import pytest

from nvshim.config import Config
from nvshim.errors import RequestError, SpecError
from nvshim.runtime.claim import DEVICE_LIST_DIR, image_view, read_claim
from nvshim.runtime.request import parse_capabilities, resolve_request

U0 = "GPU-11111111-2222-3333-4444-555555555550"
U1 = "GPU-11111111-2222-3333-4444-555555555551"
M0 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeee0"


def request_of(view, config):
    """The request create resolves: from the claim read once off the view."""
    return resolve_request(read_claim(view, config), config)


def spec(env=None, mounts=None, annotations=None, caps=None, devices=None):
    process = {"env": env or []}
    if caps is not None:
        process["capabilities"] = {"bounding": caps}
    s = {"process": process, "mounts": mounts or []}
    if annotations is not None:
        s["annotations"] = annotations
    if devices is not None:
        s["linux"] = {"resources": {"devices": devices}}
    return s


def test_last_env_entry_wins():
    """With two NVIDIA_VISIBLE_DEVICES entries the last one counts, as in runc."""
    view = image_view(spec(["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=1"]))
    assert request_of(view, Config()).devices == ("1",)


@pytest.mark.parametrize(
    "env,source,devices,driver_files",
    [
        ([], "none", (), False),
        (["NVIDIA_VISIBLE_DEVICES="], "none", (), False),
        (["NVIDIA_VISIBLE_DEVICES=void"], "none", (), False),
        (["NVIDIA_VISIBLE_DEVICES=none"], "env", (), True),
        (["NVIDIA_VISIBLE_DEVICES=all"], "env", ("all",), True),
        (["NVIDIA_VISIBLE_DEVICES=0,2"], "env", ("0", "2"), True),
        (["CUDA_VERSION=11.0"], "legacy-image", ("all",), True),
        (["CUDA_VERSION=11.0", "NVIDIA_REQUIRE_CUDA=cuda>=11.0"], "none", (), False),
        (["CUDA_VERSION=11.0", "NVIDIA_VISIBLE_DEVICES=void"], "none", (), False),
        (["CUDA_VERSION=11.0", "NVIDIA_VISIBLE_DEVICES=1"], "env", ("1",), True),
        (["CUDA_VERSION="], "none", (), False),
    ],
)
def test_env_sources(env, source, devices, driver_files):
    """Unset/empty/void ask for nothing, none asks for driver files, legacy images mean all."""
    req = request_of(image_view(spec(env)), Config())
    assert (req.source, req.devices, req.driver_files) == (source, devices, driver_files)


@pytest.mark.parametrize("privileged", [True, False])
@pytest.mark.parametrize("accept", [True, False])
def test_privileged_and_accept_flag(privileged, accept):
    """Unprivileged env requests are honoured only when accept-envvar-when-unprivileged is on."""
    caps = ["CAP_SYS_ADMIN"] if privileged else ["CAP_CHOWN"]
    view = image_view(spec(["NVIDIA_VISIBLE_DEVICES=0"], caps=caps))
    req = request_of(view, Config(accept_envvar_when_unprivileged=accept))
    assert req.devices == (("0",) if privileged or accept else ())
    if not (privileged or accept):
        assert any("unprivileged" in n for n in req.notes)


#: What containerd's CRI plugin writes on a pod sandbox: the marker counts only with the rest.
SANDBOX = {
    "io.kubernetes.cri.container-type": "sandbox",
    "io.kubernetes.cri.sandbox-id": "5b1e",
    "io.kubernetes.cri.sandbox-name": "pod",
    "io.kubernetes.cri.sandbox-namespace": "ns",
    "io.kubernetes.cri.sandbox-uid": "uid",
}


def test_sandbox_passes_through():
    """A CRI sandbox container is never a GPU container, whatever its env says."""
    s = spec(["NVIDIA_VISIBLE_DEVICES=all"], annotations=SANDBOX)
    req = request_of(image_view(s), Config())
    assert req.source == "sandbox" and not req.injects


def devmount(ident):
    return {
        "source": "/dev/null",
        "destination": f"/var/run/nvidia-container-devices/{ident}",
        "type": "bind",
    }


REQ = Config(require_allocation=True)
REQ_FAIL = Config(require_allocation=True, on_missing_allocation="fail")
PRIV = ["CAP_SYS_ADMIN"]
ALL_DEVICES = [{"allow": False, "access": "rwm"}, {"allow": True, "access": "rwm"}]
DENY_ALL = [{"allow": False, "access": "rwm"}]

ALLOCATION = [
    # (name, spec kwargs, config, expected source, devices, set_void)
    ("image all, no allocation", dict(env=["NVIDIA_VISIBLE_DEVICES=all"]), REQ, "none", (), True),
    ("legacy image, no allocation", dict(env=["CUDA_VERSION=12.0"]), REQ, "none", (), True),
    ("nothing asked", dict(env=[]), REQ, "none", (), False),
    ("void asked", dict(env=["NVIDIA_VISIBLE_DEVICES=void"]), REQ, "none", (), False),
    (
        "volume mount uuid beats image all",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"], mounts=[devmount(U1)]),
        REQ,
        "volume-mounts",
        (U1,),
        False,
    ),
    (
        "volume mount cdi slash form",
        dict(mounts=[devmount("cdi/nvidia.com/gpu/1")]),
        REQ,
        "volume-mounts",
        ("nvidia.com/gpu=1",),
        False,
    ),
    (
        "volume mount cdi equals form",
        dict(mounts=[devmount("cdi/nvidia.com/gpu=1")]),
        REQ,
        "volume-mounts",
        ("nvidia.com/gpu=1",),
        False,
    ),
    (
        "imex mount is not a gpu",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"], mounts=[devmount("imex/0")]),
        REQ,
        "none",
        (),
        True,
    ),
    (
        "envvar uuids accepted",
        dict(env=[f"NVIDIA_VISIBLE_DEVICES={U0},{U1}"]),
        REQ,
        "envvar-uuids",
        (U0, U1),
        False,
    ),
    (
        "envvar mig uuid accepted",
        dict(env=[f"NVIDIA_VISIBLE_DEVICES={M0}"]),
        REQ,
        "envvar-uuids",
        (M0,),
        False,
    ),
    ("envvar index refused", dict(env=["NVIDIA_VISIBLE_DEVICES=0"]), REQ, "none", (), True),
    ("envvar all refused", dict(env=["NVIDIA_VISIBLE_DEVICES=all"]), REQ, "none", (), True),
    (
        "envvar uuid mixed with index refused",
        dict(env=[f"NVIDIA_VISIBLE_DEVICES={U0},1"]),
        REQ,
        "none",
        (),
        True,
    ),
    (
        "cdi annotation",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"], annotations={"cdi.k8s.io/x": "nvidia.com/gpu=1"}),
        REQ,
        "cdi-annotations",
        ("nvidia.com/gpu=1",),
        False,
    ),
    (
        "privileged all accepted",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"], caps=PRIV, devices=ALL_DEVICES),
        REQ,
        "privileged",
        ("all",),
        False,
    ),
    (
        "sys-admin alone is not privileged",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"], caps=PRIV, devices=DENY_ALL),
        REQ,
        "none",
        (),
        True,
    ),
    (
        "sys-admin without device rules is not privileged",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"], caps=PRIV),
        REQ,
        "none",
        (),
        True,
    ),
    (
        "all devices without sys-admin is not privileged",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"], caps=["CAP_CHOWN"], devices=ALL_DEVICES),
        REQ,
        "none",
        (),
        True,
    ),
    (
        "mount beats annotation",
        dict(mounts=[devmount("0")], annotations={"cdi.k8s.io/x": "nvidia.com/gpu=1"}),
        REQ,
        "volume-mounts",
        ("0",),
        False,
    ),
    (
        "off: env all granted",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"]),
        Config(),
        "env",
        ("all",),
        False,
    ),
    (
        "off: mount beats env",
        dict(env=["NVIDIA_VISIBLE_DEVICES=all"], mounts=[devmount("1")]),
        Config(),
        "volume-mounts",
        ("1",),
        False,
    ),
    (
        "off: mount at //var/run beats env",
        dict(
            env=["NVIDIA_VISIBLE_DEVICES=all"],
            mounts=[dict(devmount("1"), destination="//var/run/nvidia-container-devices/1")],
        ),
        Config(),
        "volume-mounts",
        ("1",),
        False,
    ),
    (
        "off: relative mount beats env",
        dict(
            env=["NVIDIA_VISIBLE_DEVICES=all"],
            mounts=[dict(devmount("1"), destination="var/run/nvidia-container-devices/1/")],
        ),
        Config(),
        "volume-mounts",
        ("1",),
        False,
    ),
    (
        "off: annotation beats env",
        dict(
            env=["NVIDIA_VISIBLE_DEVICES=0"],
            annotations={
                "cdi.k8s.io/b": "nvidia.com/gpu=0",
                "cdi.k8s.io/a": "nvidia.com/gpu=1,nvidia.com/gpu=0",
                "other": "x",
            },
        ),
        Config(),
        "cdi-annotations",
        ("nvidia.com/gpu=1", "nvidia.com/gpu=0"),
        False,
    ),
    (
        "only privileged source: unprivileged uuid refused",
        dict(env=[f"NVIDIA_VISIBLE_DEVICES={U0}"]),
        Config(require_allocation=True, allocation_sources=("privileged",)),
        "none",
        (),
        True,
    ),
    (
        "volume mount cdi all needs accept-all",
        dict(mounts=[devmount("cdi/nvidia.com/gpu/all")]),
        REQ,
        "none",
        (),
        False,
    ),
    (
        "volume mount cdi=all needs accept-all",
        dict(mounts=[devmount("cdi/nvidia.com/gpu=all")]),
        REQ,
        "none",
        (),
        False,
    ),
    (
        "volume mount bare cdi all needs accept-all",
        dict(mounts=[devmount("nvidia.com/gpu=all")]),
        REQ,
        "none",
        (),
        False,
    ),
    (
        "volume mount cdi all dropped, gpu kept",
        dict(mounts=[devmount("1"), devmount("cdi/nvidia.com/gpu/all")]),
        REQ,
        "volume-mounts",
        ("1",),
        False,
    ),
    (
        "volume mount cdi all with accept-all",
        dict(mounts=[devmount("cdi/nvidia.com/gpu/all")]),
        Config(require_allocation=True, accept_all_from_mounts=True),
        "volume-mounts",
        ("nvidia.com/gpu=all",),
        False,
    ),
    (
        "volume mount none is no allocation",
        dict(env=["NVIDIA_MOFED=enabled"], mounts=[devmount("none")]),
        REQ,
        "none",
        (),
        False,
    ),
    (
        "cdi annotation none is no allocation",
        dict(annotations={"cdi.k8s.io/x": "none"}),
        REQ,
        "none",
        (),
        False,
    ),
    (
        "privileged none still counts",
        dict(env=["NVIDIA_VISIBLE_DEVICES=none"], caps=PRIV, devices=ALL_DEVICES),
        REQ,
        "privileged",
        (),
        False,
    ),
    (
        "custom annotation prefix",
        dict(annotations={"acme/gpus": "nvidia.com/gpu=0"}),
        Config(require_allocation=True, annotation_prefixes=("acme/",)),
        "cdi-annotations",
        ("nvidia.com/gpu=0",),
        False,
    ),
]


@pytest.mark.parametrize(
    "name,kw,config,source,devices,set_void", ALLOCATION, ids=[a[0] for a in ALLOCATION]
)
def test_allocation_sources(name, kw, config, source, devices, set_void):
    """require-allocation grants GPUs only from device-plugin allocations, never image env alone."""
    req = request_of(image_view(spec(**kw)), config)
    assert (req.source, req.devices, req.set_void) == (source, devices, set_void)
    if set_void:
        assert any("require-allocation" in n for n in req.notes)


def test_sys_admin_alone_is_noted():
    """A container with SYS_ADMIN but a restricted device cgroup is told why the privileged
    source did not take it."""
    req = request_of(
        image_view(spec(["NVIDIA_VISIBLE_DEVICES=all"], caps=PRIV, devices=DENY_ALL)), REQ
    )
    assert any("does not allow every device" in n for n in req.notes)


C195 = {"allow": True, "type": "c", "major": 195, "access": "rwm"}


@pytest.mark.parametrize(
    "rules,allowed",
    [
        ([{"allow": True, "access": "rwm"}], True),
        ([{"allow": True}], True),
        ([{"allow": True, "type": "a", "access": "rw"}], True),
        ([{"allow": False, "access": "rwm"}, {"allow": True, "access": "rwm"}], True),
        ([{"allow": True, "access": "rwm"}, C195], True),
        ([{"allow": True, "access": "rwm"}, {"allow": False, "access": "rwm"}], False),
        ([{"allow": True, "access": "rwm"}, dict(C195, allow=False)], False),
        ([{"allow": True, "access": "m"}], False),
        ([{"allow": True, "type": "c", "access": "rwm"}], False),
        ([C195], False),
        ([{"allow": "true", "access": "rwm"}], False),
        ([], False),
        ("allow", False),
        ([["allow"]], False),
    ],
)
def test_all_devices_allowed(rules, allowed):
    """Only a device cgroup that ends up allowing every device, for read and write, counts."""
    assert image_view(spec(devices=rules)).all_devices_allowed is allowed


def test_missing_allocation_fail_mode():
    """on-missing-allocation: fail turns a stripped image request into an error naming the sources."""
    with pytest.raises(
        RequestError,
        match="no device-plugin allocation was found .tried volume-mounts, cdi-annotations, docker-gpus, envvar-uuids, privileged.",
    ):
        request_of(image_view(spec(["NVIDIA_VISIBLE_DEVICES=all"])), REQ_FAIL)
    # a container that asks for nothing is not a failure
    assert not request_of(image_view(spec([])), REQ_FAIL).injects


@pytest.mark.parametrize(
    "bad,message",
    [
        ([], "top level must be a JSON object"),
        ({"process": []}, "process must be an object"),
        ({"process": {"env": "A=B"}}, "process.env must be a list of strings"),
        ({"process": {"env": [1]}}, "process.env must be a list of strings"),
        (
            {"process": {"capabilities": {"bounding": "x"}}},
            "process.capabilities.bounding must be a list",
        ),
        ({"mounts": {}}, "mounts must be a list of objects"),
        ({"annotations": {"a": 1}}, "annotations must be an object of strings"),
    ],
)
def test_image_view_rejects_wrong_shapes(bad, message):
    """A config.json with wrong types is one clear SpecError naming the field."""
    with pytest.raises(SpecError, match=message):
        image_view(bad)


ALL7 = ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")


@pytest.mark.parametrize(
    "value,legacy,expected",
    [
        (None, False, ("compute", "utility")),
        ("", False, ("compute", "utility")),
        (None, True, ALL7),
        ("utility", False, ("utility",)),
        ("compute, video", False, ("compute", "video")),
        ("all", False, ALL7),
        ("ALL", False, ALL7),
        ("display,graphics", False, ("display", "graphics")),
    ],
)
def test_capabilities(value, legacy, expected):
    """NVIDIA_DRIVER_CAPABILITIES parses to a sorted capability set with the documented defaults."""
    assert parse_capabilities(value, ALL7, legacy) == expected


@pytest.mark.parametrize(
    "env,config",
    [
        (["NVIDIA_DRIVER_CAPABILITIES=gaming"], Config()),
        (["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_DRIVER_CAPABILITIES=gaming"], Config()),
        (
            ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=video"],
            Config(accept_envvar_when_unprivileged=False),
        ),
        (["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=gaming"], REQ),
        (
            ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=graphics,display"],
            Config(require_allocation=True, supported_driver_capabilities=("compute", "utility")),
        ),
    ],
)
def test_capabilities_are_not_judged_for_a_container_granted_nothing(env, config):
    """A container that gets no GPU runs as with runc: its image's capability list, however
    wrong or unsupported on this node, is not an error (require-allocation strips instead)."""
    req = request_of(image_view(spec(env)), config)
    assert not req.injects and req.capabilities == ()
    assert req.set_void == (config.require_allocation)


def test_unknown_capability():
    """An unknown capability is an error naming it."""
    with pytest.raises(RequestError, match='unknown driver capability "gaming"'):
        parse_capabilities("compute,gaming", ALL7, False)
    with pytest.raises(RequestError, match='"video" is not supported'):
        parse_capabilities("video", ("compute", "utility"), False)


def test_the_claim_is_parsed_once_into_fields_every_consumer_reads():
    """read_claim parses env tokens, mount ids, annotation ids, IMEX ids and the feature env
    once; its properties answer "does it claim GPUs / IMEX / extras?" without parsing."""
    mounts = [
        {"source": "/dev/null", "destination": f"{DEVICE_LIST_DIR}/{i}"}
        for i in ("GPU-aaaaaaaa-0000-0000-0000-000000000000::2", "imex/3", "cdi/x")
    ]
    claim = read_claim(
        image_view(
            spec(
                ["NVIDIA_VISIBLE_DEVICES=1, 0,1", "NVIDIA_IMEX_CHANNELS= ", "NVIDIA_GDS=enabled"],
                mounts=mounts,
                annotations={
                    "cdi.k8s.io/b": "acme.com/d=2",
                    "cdi.k8s.io/a": "acme.com/d=1",
                    "other/a": "x",
                },
            )
        ),
        Config(),
    )
    assert claim.env_tokens == ("1", "0")
    assert claim.mount_raw == ("GPU-aaaaaaaa-0000-0000-0000-000000000000::2", "imex/3", "cdi/x")
    assert claim.mount_ids == ("GPU-aaaaaaaa-0000-0000-0000-000000000000",)
    assert len(claim.mount_notes) == 2  # the IMEX mount is no GPU; cdi/x is no CDI name
    assert claim.annotation_keys == ("cdi.k8s.io/a", "cdi.k8s.io/b")
    assert claim.annotation_ids == ("acme.com/d=1", "acme.com/d=2")
    assert (claim.imex_mount_ids, claim.imex_env, claim.feature_env) == (
        ("3",),
        " ",
        ("NVIDIA_GDS",),
    )
    assert claim.claims_gpus and claim.claims_imex and claim.asks_for_extras


@pytest.mark.parametrize(
    "env,mounts,gpus,imex,extras",
    [
        ([], [], False, False, False),
        (["NVIDIA_VISIBLE_DEVICES="], [], False, False, False),
        (["NVIDIA_VISIBLE_DEVICES=void"], [], False, False, False),
        (["NVIDIA_VISIBLE_DEVICES=none"], [], True, False, False),
        (["CUDA_VERSION=12.4"], [], True, False, False),
        (["CUDA_VERSION=12.4", "NVIDIA_VISIBLE_DEVICES="], [], False, False, False),
        (["NVIDIA_IMEX_CHANNELS= "], [], False, False, True),
        (["NVIDIA_IMEX_CHANNELS=0"], [], False, True, True),
        # an /imex/ path that is no device-plugin mount is no IMEX claim
        ([], [{"source": "/dev/null", "destination": "/opt/imex/0"}], False, False, False),
        (
            [],
            [{"source": "/dev/null", "destination": f"{DEVICE_LIST_DIR}/imex/0"}],
            False,
            True,
            True,
        ),
        ([], [{"source": "/dev/null", "destination": f"{DEVICE_LIST_DIR}/0"}], True, False, False),
    ],
)
def test_claim_properties(env, mounts, gpus, imex, extras):
    """Each way of (not) claiming a GPU, an IMEX channel or an extra reads as such."""
    claim = read_claim(image_view(spec(env, mounts=mounts)), Config())
    assert (claim.claims_gpus, claim.claims_imex, claim.asks_for_extras) == (gpus, imex, extras)


def test_a_sandbox_claims_nothing():
    """A CRI sandbox's claim is empty whatever its env says."""
    claim = read_claim(
        image_view(
            spec(
                ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_GDS=enabled"],
                annotations={**SANDBOX, "cdi.k8s.io/x": "a.com/b=c"},
            )
        ),
        Config(),
    )
    assert claim.env_tokens is None and claim.annotation_keys == ()
    assert not (claim.claims_gpus or claim.claims_imex or claim.asks_for_extras)
