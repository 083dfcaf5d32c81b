"""The NRI codec (:mod:`nvshim.agent.nri.api`) against the messages protoc generates from NRI's
api.proto (:mod:`nvshim.agent.nri.api_pb2`): random messages built with the generated classes,
unknown-to-nvshim fields filled too, decode through api.py to the values the message holds, and
what api.py encodes parses back as the message the values describe."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from hypothesis import given, settings
from hypothesis import strategies as st

from nvshim.agent.nri import api
from nvshim.agent.nri import api_pb2 as pb

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
texts = st.lists(text, max_size=3)
maps = st.dictionaries(text, text, max_size=3)
u32 = st.integers(min_value=0, max_value=(1 << 32) - 1)
i64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
i32 = st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1)

#: api.py's hook names (OCI's) and the Hooks fields of api.proto
HOOKS = (
    ("prestart", "prestart"),
    ("createRuntime", "create_runtime"),
    ("createContainer", "create_container"),
    ("startContainer", "start_container"),
    ("poststart", "poststart"),
    ("poststop", "poststop"),
)


def _set(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in kwargs.items() if v is not None}


@st.composite
def pb_pods(draw: Any) -> Any:
    return pb.PodSandbox(
        id=draw(text),
        name=draw(text),
        uid=draw(text),
        namespace=draw(text),
        labels=draw(maps),
        annotations=draw(maps),
        runtime_handler=draw(text),
        pid=draw(u32),
        ips=draw(texts),
    )


@st.composite
def pb_mounts(draw: Any) -> Any:
    return pb.Mount(destination=draw(text), type=draw(text), source=draw(text), options=draw(texts))


@st.composite
def pb_hooks(draw: Any) -> Any:
    timeout = draw(st.none() | i64)
    return pb.Hook(
        **_set(
            dict(
                path=draw(text),
                args=draw(texts),
                env=draw(texts),
                timeout=None if timeout is None else pb.OptionalInt(value=timeout),
            )
        )
    )


@st.composite
def pb_devices(draw: Any) -> Any:
    mode, uid, gid = draw(st.none() | u32), draw(st.none() | u32), draw(st.none() | u32)
    return pb.LinuxDevice(
        **_set(
            dict(
                path=draw(text),
                type=draw(text),
                major=draw(i64),
                minor=draw(i64),
                file_mode=None if mode is None else pb.OptionalFileMode(value=mode),
                uid=None if uid is None else pb.OptionalUInt32(value=uid),
                gid=None if gid is None else pb.OptionalUInt32(value=gid),
            )
        )
    )


@st.composite
def pb_containers(draw: Any) -> Any:
    hooks = draw(
        st.none()
        | st.fixed_dictionaries({name: st.lists(pb_hooks(), max_size=2) for _, name in HOOKS})
    )
    linux = draw(
        st.none()
        | st.builds(
            lambda devices, path, oom: pb.LinuxContainer(
                **_set(
                    dict(
                        devices=devices,
                        cgroups_path=path,
                        oom_score_adj=None if oom is None else pb.OptionalInt(value=oom),
                    )
                )
            ),
            st.lists(pb_devices(), max_size=3),
            text,
            st.none() | i64,
        )
    )
    return pb.Container(
        **_set(
            dict(
                id=draw(text),
                pod_sandbox_id=draw(text),
                name=draw(text),
                state=draw(st.integers(min_value=0, max_value=4)),
                labels=draw(maps),
                annotations=draw(maps),
                args=draw(texts),
                env=draw(texts),
                mounts=draw(st.lists(pb_mounts(), max_size=3)),
                hooks=None if hooks is None else pb.Hooks(**hooks),
                linux=linux,
                pid=draw(u32),
                created_at=draw(i64),
                exit_code=draw(i32),
                status_message=draw(text),
                CDI_devices=[pb.CDIDevice(name=n) for n in draw(texts)],
            )
        )
    )


def expected_pod(m: Any) -> api.Pod:
    return api.Pod(
        id=m.id,
        name=m.name,
        uid=m.uid,
        namespace=m.namespace,
        annotations=dict(m.annotations),
        runtime_handler=m.runtime_handler,
    )


def _optional(m: Any, name: str) -> Optional[int]:
    return getattr(m, name).value if m.HasField(name) else None


def expected_hook(m: Any) -> api.Hook:
    return api.Hook(m.path, tuple(m.args), tuple(m.env), _optional(m, "timeout"))


def expected_device(m: Any) -> api.Device:
    return api.Device(
        m.path,
        m.type,
        m.major,
        m.minor,
        _optional(m, "file_mode"),
        _optional(m, "uid"),
        _optional(m, "gid"),
    )


def expected_container(m: Any) -> api.Container:
    hooks = {
        oci: tuple(expected_hook(h) for h in getattr(m.hooks, name))
        for oci, name in HOOKS
        if getattr(m.hooks, name)
    }
    return api.Container(
        id=m.id,
        pod_sandbox_id=m.pod_sandbox_id,
        name=m.name,
        annotations=dict(m.annotations),
        args=tuple(m.args),
        env=tuple(m.env),
        mounts=tuple(
            api.Mount(x.destination, x.type, x.source, tuple(x.options)) for x in m.mounts
        ),
        hooks=hooks,
        devices=tuple(expected_device(d) for d in m.linux.devices),
        pid=m.pid,
        cdi_devices=tuple(d.name for d in m.CDI_devices),
        cgroups_path=m.linux.cgroups_path,
    )


@settings(max_examples=300)
@given(st.none() | pb_pods(), st.none() | pb_containers())
def test_create_container_request_decodes_as_generated(pod: Any, container: Any) -> None:
    """A CreateContainerRequest (and a Start/RemoveContainerRequest, the same shape) decodes
    to the pod and container the generated message holds, their other fields skipped."""
    request = pb.CreateContainerRequest(**_set(dict(pod=pod, container=container)))
    data = request.SerializeToString()
    assert api.decode_pod_container(data) == (
        expected_pod(request.pod),
        expected_container(request.container),
    )
    for method, event in (
        ("StartContainer", api.Event.START_CONTAINER),
        ("RemoveContainer", api.Event.REMOVE_CONTAINER),
    ):
        assert api.decode_event(method, data) == (
            event,
            request.container.id,
            request.container.pid,
        )


@settings(max_examples=200)
@given(st.integers(min_value=0, max_value=11), st.none() | pb_pods(), st.none() | pb_containers())
def test_state_change_decodes_as_generated(event: int, pod: Any, container: Any) -> None:
    """A StateChangeEvent decodes to its event, pod and container, and to the container's id
    and pid alone."""
    change = pb.StateChangeEvent(**_set(dict(event=event, pod=pod, container=container)))
    data = change.SerializeToString()
    assert api.decode_state_change(data) == (
        event,
        expected_pod(change.pod),
        expected_container(change.container),
    )
    assert api.decode_event("StateChange", data) == (
        event,
        change.container.id,
        change.container.pid,
    )


@given(text, text, text, i64, i64, text)
def test_configure_request_decodes_as_generated(
    config: str, name: str, version: str, registration: int, request: int, nri: str
) -> None:
    """A ConfigureRequest decodes to the runtime's name and version and the NRI version."""
    data = pb.ConfigureRequest(
        config=config,
        runtime_name=name,
        runtime_version=version,
        registration_timeout=registration,
        request_timeout=request,
        NRI_version=nri,
    ).SerializeToString()
    assert api.decode_configure(data) == {"runtime": name, "version": version, "nri": nri}


@st.composite
def api_mounts(draw: Any) -> api.Mount:
    return api.Mount(draw(text), draw(text), draw(text), tuple(draw(texts)))


@st.composite
def api_hooks(draw: Any) -> api.Hook:
    return api.Hook(draw(text), tuple(draw(texts)), tuple(draw(texts)), draw(st.none() | i64))


@st.composite
def api_devices(draw: Any) -> api.Device:
    return api.Device(
        draw(text),
        draw(text),
        draw(i64),
        draw(i64),
        draw(st.none() | u32),
        draw(st.none() | u32),
        draw(st.none() | u32),
    )


def pb_hook(h: api.Hook) -> Any:
    timeout = None if h.timeout is None else pb.OptionalInt(value=h.timeout)
    return pb.Hook(**_set(dict(path=h.path, args=h.args, env=h.env, timeout=timeout)))


def pb_device(d: api.Device) -> Any:
    def opt(kind: Any, value: Optional[int]) -> Any:
        return None if value is None else kind(value=value)

    return pb.LinuxDevice(
        **_set(
            dict(
                path=d.path,
                type=d.type,
                major=d.major,
                minor=d.minor,
                file_mode=opt(pb.OptionalFileMode, d.file_mode),
                uid=opt(pb.OptionalUInt32, d.uid),
                gid=opt(pb.OptionalUInt32, d.gid),
            )
        )
    )


def pb_mount(m: api.Mount) -> Any:
    return pb.Mount(destination=m.destination, type=m.type, source=m.source, options=m.options)


def expected_adjustment(a: api.Adjustment) -> Any:
    """The ContainerAdjustment ``a`` describes: hooks present when any kind is named (even
    with none), linux present when there are devices."""
    hooks = None
    if a.hooks:
        fields = dict((oci, name) for oci, name in HOOKS)
        hooks = pb.Hooks(**{fields[kind]: [pb_hook(h) for h in hs] for kind, hs in a.hooks.items()})
    linux = (
        pb.LinuxContainerAdjustment(devices=[pb_device(d) for d in a.devices])
        if a.devices
        else None
    )
    return pb.ContainerAdjustment(
        **_set(
            dict(
                annotations=a.annotations,
                mounts=[pb_mount(m) for m in a.mounts],
                env=[pb.KeyValue(key=k, value=v) for k, v in a.env],
                hooks=hooks,
                linux=linux,
            )
        )
    )


adjustments = st.builds(
    api.Adjustment,
    maps,
    st.lists(api_mounts(), max_size=3).map(tuple),
    st.lists(st.tuples(text, text), max_size=3).map(tuple),
    st.dictionaries(
        st.sampled_from([oci for oci, _ in HOOKS]),
        st.lists(api_hooks(), max_size=2).map(tuple),
        max_size=3,
    ),
    st.lists(api_devices(), max_size=3).map(tuple),
)


def _presence(m: Any, names: Tuple[str, ...]) -> List[bool]:
    return [m.HasField(n) for n in names]


@settings(max_examples=300)
@given(adjustments)
def test_create_reply_parses_as_generated(adjust: api.Adjustment) -> None:
    """encode_create_reply's bytes parse as the CreateContainerResponse whose adjustment
    the values describe (nothing at all for an empty adjustment)."""
    data = api.encode_create_reply(adjust)
    if not adjust:
        assert data == b""
        return
    got = pb.CreateContainerResponse.FromString(data)
    want = expected_adjustment(adjust)
    assert got.adjust == want
    assert _presence(got.adjust, ("hooks", "linux")) == _presence(want, ("hooks", "linux"))
    assert not got.update and not got.evict


@given(api_mounts(), api_hooks(), api_devices())
def test_mount_hook_device_encode_as_generated(
    mount: api.Mount, hook: api.Hook, device: api.Device
) -> None:
    """Mount, Hook and Device encode as the generated Mount, Hook and LinuxDevice (an
    optional wrapper present exactly when its value is not None, 0 included)."""
    assert pb.Mount.FromString(mount.encode()) == pb_mount(mount)
    got_hook = pb.Hook.FromString(hook.encode())
    assert got_hook == pb_hook(hook) and got_hook.HasField("timeout") == (hook.timeout is not None)
    got = pb.LinuxDevice.FromString(device.encode())
    assert got == pb_device(device)
    assert _presence(got, ("file_mode", "uid", "gid")) == [
        v is not None for v in (device.file_mode, device.uid, device.gid)
    ]


@given(
    text,
    text,
    st.integers(min_value=0, max_value=(1 << 11) - 1),
    st.booleans(),
    st.lists(pb_pods(), max_size=2),
)
def test_register_configure_and_sync_replies_parse_as_generated(
    name: str, index: str, events: int, more: bool, pods: List[Any]
) -> None:
    """RegisterPluginRequest, ConfigureResponse and SynchronizeResponse (``more`` echoing
    the request's) parse as the generated messages."""
    assert pb.RegisterPluginRequest.FromString(
        api.encode_register(name, index)
    ) == pb.RegisterPluginRequest(plugin_name=name, plugin_idx=index)
    assert pb.ConfigureResponse.FromString(
        api.encode_configure_reply(events)
    ) == pb.ConfigureResponse(events=events)
    request = pb.SynchronizeRequest(pods=pods, more=more).SerializeToString()
    assert pb.SynchronizeResponse.FromString(
        api.encode_sync_reply(request)
    ) == pb.SynchronizeResponse(more=more)


def test_event_numbers_are_the_generated_enum() -> None:
    """api.Event's numbers are NRI's Event enum, and the subscription mask is bit event-1."""
    for name, number in pb.Event.items():
        if name not in ("UNKNOWN", "LAST", "ALL"):
            assert getattr(api.Event, name, number) == number, name
    assert api.Event.CREATE_CONTAINER == pb.CREATE_CONTAINER
    assert api.event_mask(api.Event.CREATE_CONTAINER, api.Event.START_CONTAINER) == (
        1 << (pb.CREATE_CONTAINER - 1)
    ) | (1 << (pb.START_CONTAINER - 1))
