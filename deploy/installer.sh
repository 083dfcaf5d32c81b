#!/bin/sh
# nvshim-installer: the entrypoint of the nvshim-installer DaemonSet's container (POSIX sh).
#
# 1. Install. Copies the image's payload (NVSHIM_PAYLOAD, /payload: opt/nvshim, usr/local/bin,
#    install.sh, config/) to the node's NVSHIM_STAGE (/var/lib/nvshim-installer/payload) and the
#    ConfigMap's config.yaml (NVSHIM_CONFIGMAP_FILE, /config/config.yaml) to the node's
#    $NVSHIM_ETCDIR/config.yaml (/etc/nvshim), both through the hostPath mounts the container
#    sees under NVSHIM_HOST_ROOT (/host). Then runs `sh STAGE/install.sh --from STAGE
#    --containerd` on the node, in PID 1's namespaces (NVSHIM_NODE_EXEC, default
#    "nsenter -t 1 -m -u -i -n -p --": hence hostPID and privileged), with an explicit env: PATH,
#    NVSHIM_SKIP_APT=1 and those of the NVSHIM_* settings below that are set. install.sh
#    restarts containerd (NVSHIM_RESTART_MODE systemd, signal or none) and, when containerd does
#    not come back, puts its previous config back. Success: NVSHIM_READY_FILE appears (the
#    readiness probe). Failure: one line, the pod stays up and not ready (no restart loop that
#    bounces containerd); a ConfigMap change, or deleting the pod, tries again.
# 2. Watch. Every NVSHIM_WATCH_INTERVAL seconds (10) it compares the mounted config.yaml with the
#    last one it saw (the kubelet swaps a ConfigMap volume's files through its ..data symlink).
#    A new one is checked on the node first (`nvshim config compile --check`, with
#    --default-runtime when NVSHIM_SET_AS_DEFAULT=true or the node's config carries install.sh's
#    default-runtime mark: require-allocation must be on), then replaces the node's config and
#    `nvshim config compile` runs there; containerd is not restarted, its config did not
#    change. One nvshim refuses never reaches the node's config.yaml: the previous one stays,
#    and one line says why. A ConfigMap config.yaml that is empty or holds only comments (read
#    as the built-in defaults) is refused the same way, at install and at every change.
#    On a node without systemd (NVSHIM_CDI_REFRESH=auto, the default) it also runs
#    `nvshim cdi refresh --watch` there, which regenerates the CDI specs the config's
#    cdi-refresh lists, the node plan and the CDI index when the driver changes (where systemd
#    runs, install.sh's nvshim-cdi-refresh.path does it); `watch` runs it anyway, `off` never.
# 3. SIGTERM (DaemonSet deleted, pod rolled or evicted): uninstall. `STAGE/install.sh --uninstall`
#    puts containerd's config back byte for byte, restarts containerd the same way and removes
#    nvshim's files; then the config.yaml written from the ConfigMap and STAGE go too.
#    NVSHIM_KEEP_ON_EXIT=true leaves everything installed.
#    Only the installer that installed last uninstalls: each pod keeps a token of its own in
#    its state folder and writes it to the node's $(dirname STAGE)/owner once installed. In a
#    rollout (the DaemonSet's maxSurge: the new pod installs beside the old one, which is
#    stopped once the new one is ready) the old pod finds the new pod's token there and
#    stops without uninstalling, so GPU pods never meet a node without the nvshim handler.
#
# Passed to install.sh when set: NVSHIM_PREFIX, NVSHIM_BINDIR, NVSHIM_ETCDIR,
# NVSHIM_CONTAINERD_CONFIG, NVSHIM_CONTAINERD_DROP_IN, NVSHIM_CONTAINERD_SOCKET,
# NVSHIM_CONTAINERD_CONFIG_SEED, NVSHIM_RESTART_MODE, NVSHIM_RESTART_UNIT,
# NVSHIM_RESTART_SIGNAL, NVSHIM_RESTART_TIMEOUT (see install.sh --help and deploy/README.md).
# Always passed: NVSHIM_AGENT_UNIT=off (the agent container below is the node's agent; no
# nvshim-agent.service beside it). NVSHIM_SET_AS_DEFAULT=true adds --set-as-default, NVSHIM_ENABLE_NRI=true adds --nri
# (containerd 1.7's NRI on, for the agent's NRI plugin). Every path above is the node's path.
set -u

HOST_ROOT=${NVSHIM_HOST_ROOT-/host}
NODE_EXEC=${NVSHIM_NODE_EXEC-nsenter -t 1 -m -u -i -n -p --}
PAYLOAD=${NVSHIM_PAYLOAD:-/payload}
STAGE=${NVSHIM_STAGE:-/var/lib/nvshim-installer/payload}
CONFIGMAP_FILE=${NVSHIM_CONFIGMAP_FILE:-/config/config.yaml}
READY_FILE=${NVSHIM_READY_FILE:-/run/nvshim-installer/ready}
WATCH_INTERVAL=${NVSHIM_WATCH_INTERVAL:-10}
KEEP_ON_EXIT=${NVSHIM_KEEP_ON_EXIT:-false}
SET_AS_DEFAULT=${NVSHIM_SET_AS_DEFAULT:-false}
ENABLE_NRI=${NVSHIM_ENABLE_NRI:-false}
CDI_REFRESH=${NVSHIM_CDI_REFRESH:-auto}
ETCDIR=${NVSHIM_ETCDIR:-/etc/nvshim}
BINDIR=${NVSHIM_BINDIR:-/usr/local/bin}
NODE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
PASS="NVSHIM_PREFIX NVSHIM_BINDIR NVSHIM_ETCDIR NVSHIM_CONTAINERD_CONFIG NVSHIM_CONTAINERD_DROP_IN
NVSHIM_CONTAINERD_SOCKET NVSHIM_CONTAINERD_CONFIG_SEED NVSHIM_RESTART_MODE NVSHIM_RESTART_UNIT
NVSHIM_RESTART_SIGNAL NVSHIM_RESTART_TIMEOUT"
# what this container remembers (an emptyDir beside the ready file: kept across container restarts)
STATE=$(dirname "$READY_FILE")
SEEN=$STATE/configmap-seen.yaml        # the ConfigMap's config.yaml as last looked at
APPLIED=$STATE/configmap-applied.yaml  # the bytes this installer last put on the node
# the node's: bindir= and etcdir= of the install, read by the agent container (whose command
# names /run/nvshim/node-paths: NVSHIM_NODE_PATHS moves it for tests only)
NODE_PATHS=${NVSHIM_NODE_PATHS:-/run/nvshim/node-paths}
# this pod's token (kept across its container restarts) and the node's record of the
# installer that installed last (see 3. above)
TOKEN_FILE=$STATE/owner-token
OWNER=$(dirname "$STAGE")/owner

say() { printf 'nvshim-installer: %s\n' "$*" >&2; }

case $KEEP_ON_EXIT in true|false) ;; *) say "NVSHIM_KEEP_ON_EXIT=$KEEP_ON_EXIT is neither true nor false"; exit 1 ;; esac
case $SET_AS_DEFAULT in true|false) ;; *) say "NVSHIM_SET_AS_DEFAULT=$SET_AS_DEFAULT is neither true nor false"; exit 1 ;; esac
case $ENABLE_NRI in true|false) ;; *) say "NVSHIM_ENABLE_NRI=$ENABLE_NRI is neither true nor false"; exit 1 ;; esac
case $CDI_REFRESH in auto|watch|off) ;; *) say "NVSHIM_CDI_REFRESH=$CDI_REFRESH is none of auto, watch, off"; exit 1 ;; esac
case $WATCH_INTERVAL in ''|*[!0-9]*|0) say "NVSHIM_WATCH_INTERVAL=$WATCH_INTERVAL is not a whole number of seconds above 0"; exit 1 ;; esac

mkdir -p "$STATE" || exit 1
if [ ! -s "$TOKEN_FILE" ]; then
    { cat /proc/sys/kernel/random/uuid > "$TOKEN_FILE.new" && mv -f "$TOKEN_FILE.new" "$TOKEN_FILE"; } \
        || { say "cannot write $TOKEN_FILE"; exit 1; }
fi
TOKEN=$(cat "$TOKEN_FILE") || exit 1

on_node() {  # on_node CMD...: run CMD on the node, with PATH, NVSHIM_SKIP_APT=1 and the set settings
    for name in $PASS; do
        eval "isset=\${$name+x} value=\${$name-}"
        # shellcheck disable=SC2154 # isset and value are assigned by the eval above
        if [ -n "$isset" ]; then set -- "$name=$value" "$@"; fi
    done
    # shellcheck disable=SC2086  # NODE_EXEC is a command line (empty: this mount namespace)
    # NVSHIM_AGENT_UNIT=off: this DaemonSet's agent container is the node's agent (a systemd
    # unit beside it would serve the same socket)
    $NODE_EXEC env -i PATH="$NODE_PATH" NVSHIM_SKIP_APT=1 NVSHIM_AGENT_UNIT=off "$@"
}

last_line() { printf '%s\n' "$1" | sed '/^[[:space:]]*$/d' | tail -n 1; }

stage_payload() {
    [ -f "$PAYLOAD/install.sh" ] || { say "no payload in the image: $PAYLOAD/install.sh not found"; return 1; }
    mkdir -p "$(dirname "$HOST_ROOT$STAGE")" \
        && rm -rf "$HOST_ROOT$STAGE.new" && cp -a "$PAYLOAD" "$HOST_ROOT$STAGE.new" \
        && rm -rf "$HOST_ROOT$STAGE" && mv "$HOST_ROOT$STAGE.new" "$HOST_ROOT$STAGE" \
        || { say "could not copy $PAYLOAD to the node's $STAGE (under $HOST_ROOT)"; return 1; }
}

NEW_CONFIG=$ETCDIR/.config.yaml.new  # the node's path of a ConfigMap config being checked

put_config() {  # put_config: the ConfigMap's config.yaml → the node's ETCDIR/config.yaml (atomic)
    cp "$CONFIGMAP_FILE" "$SEEN" || return 1
    # nothing but comments, blank lines and document markers: YAML reads no document, which
    # nvshim would take as the built-in defaults (require-allocation off): refused like empty
    if ! grep -q -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' -e '^---[[:space:]]*$' \
        -e '^\.\.\.[[:space:]]*$' "$SEEN"; then
        say "kept the previous $ETCDIR/config.yaml: the ConfigMap's config.yaml ($CONFIGMAP_FILE) is empty or holds only comments: not used"
        return 1
    fi
    mkdir -p "$HOST_ROOT$ETCDIR" && cp "$SEEN" "$HOST_ROOT$NEW_CONFIG" \
        && chmod 0644 "$HOST_ROOT$NEW_CONFIG" \
        || { say "could not write the node's $NEW_CONFIG (under $HOST_ROOT)"; return 1; }
    check_config || { rm -f "$HOST_ROOT$NEW_CONFIG"; return 1; }
    mv -f "$HOST_ROOT$NEW_CONFIG" "$HOST_ROOT$ETCDIR/config.yaml" && cp "$SEEN" "$APPLIED" \
        || { say "could not write the node's $ETCDIR/config.yaml (under $HOST_ROOT)"; return 1; }
}

check_config() {  # nvshim on the node (once installed) checks the new config before it is used
    on_node test -x "$BINDIR/nvshim" || return 0  # first install: install.sh checks it
    set -- config compile --check --config "$NEW_CONFIG"
    if [ "$SET_AS_DEFAULT" = true ] || [ -e "$HOST_ROOT$ETCDIR/config.default-runtime" ]; then
        set -- "$@" --default-runtime  # a default runtime reads it: require-allocation on
    fi
    out=$(on_node "$BINDIR/nvshim" "$@" 2>&1) && return 0
    out=$(last_line "$out")
    say "kept the previous $ETCDIR/config.yaml: the ConfigMap's new config.yaml was refused: ${out#nvshim: }"
    return 1
}

INSTALLED=false
install_node() {
    rm -f "$READY_FILE"
    stage_payload || return 1
    if [ -f "$CONFIGMAP_FILE" ]; then
        put_config || return 1
    else
        say "no ConfigMap config at $CONFIGMAP_FILE: the node keeps its own $ETCDIR/config.yaml (or gets the payload's)"
    fi
    set -- --from "$STAGE" --containerd
    if [ "$SET_AS_DEFAULT" = true ]; then set -- "$@" --set-as-default; fi
    if [ "$ENABLE_NRI" = true ]; then set -- "$@" --nri; fi
    say "installing: sh $STAGE/install.sh $*"
    if ! on_node sh "$STAGE/install.sh" "$@"; then
        say "install failed (the line above says why); this pod stays not ready: fix it, then change the ConfigMap or delete the pod to try again"
        return 1
    fi
    INSTALLED=true
    # this pod owns the node's install now: an older installer's SIGTERM leaves it alone
    printf '%s\n' "$TOKEN" > "$HOST_ROOT$OWNER.new" && mv -f "$HOST_ROOT$OWNER.new" "$HOST_ROOT$OWNER" \
        || say "cannot write the node's $OWNER: an older installer pod stopping now would uninstall"
    start_refresher
    # the agent container runs the nvshim installed here: where it is (one setting, this
    # container's, on a node with a read-only /usr), in a file on the node's /run that the
    # agent's command and readiness probe read in the node's mount namespace
    # shellcheck disable=SC2016 # the inner sh expands its own arguments
    on_node sh -c 'mkdir -p "${1%/*}" && printf "bindir=%s\netcdir=%s\n" "$2" "$3" > "$1.new" && mv "$1.new" "$1"' \
        sh "$NODE_PATHS" "$BINDIR" "$ETCDIR" \
        || say "cannot write $NODE_PATHS on the node: the agent container waits for it"
    : > "$READY_FILE"
    say "installed; watching $CONFIGMAP_FILE every ${WATCH_INTERVAL}s"
}

apply_config() {  # the ConfigMap changed: new config.yaml on the node, compiled; refused → the old one
    cur=$HOST_ROOT$ETCDIR/config.yaml old=$HOST_ROOT$ETCDIR/.config.yaml.old
    rm -f "$old"
    if [ -e "$cur" ]; then cp -p "$cur" "$old" || return 1; fi
    put_config || { rm -f "$old"; return 1; }
    if out=$(on_node "$BINDIR/nvshim" config compile --config "$ETCDIR/config.yaml" 2>&1); then
        rm -f "$old"
        say "applied the ConfigMap's new config.yaml to $ETCDIR/config.yaml (compiled; containerd not restarted)"
        return 0
    fi
    if [ -e "$old" ]; then
        mv -f "$old" "$cur" && cp "$cur" "$APPLIED"
        on_node "$BINDIR/nvshim" config compile --config "$ETCDIR/config.yaml" >/dev/null 2>&1
    fi
    say "kept the previous $ETCDIR/config.yaml: the ConfigMap's new config.yaml was refused: $(last_line "$out")"
}

# The driver watcher's node-side pid (the process nsenter forks into the node's PID namespace
# writes it, then execs nvshim): stopping nsenter alone would not reach it.
# One per pod: during a rollout the old pod's and the new pod's run side by side.
REFRESH_PID=$(dirname "$STAGE")/cdi-refresh.$TOKEN.pid
refresher=""

start_refresher() {
    [ -z "$refresher" ] || return 0
    case $CDI_REFRESH in
        off) return 0 ;;
        auto) if on_node test -d /run/systemd/system; then return 0; fi ;;
    esac
    # shellcheck disable=SC2016  # $$, $0, $1 are the node-side sh's
    on_node sh -c 'echo $$ > "$1" && exec "$0" cdi refresh --watch --interval "$2"' \
        "$BINDIR/nvshim" "$REFRESH_PID" "$WATCH_INTERVAL" &
    refresher=$!
    say "following driver changes: nvshim cdi refresh --watch every ${WATCH_INTERVAL}s (NVSHIM_CDI_REFRESH=$CDI_REFRESH)"
}

stop_refresher() {
    [ -n "$refresher" ] || return 0
    # shellcheck disable=SC2016
    on_node sh -c 'pid=$(cat "$0" 2>/dev/null) && kill "$pid" 2>/dev/null; rm -f "$0"' "$REFRESH_PID"
    wait "$refresher" 2>/dev/null
    refresher=""
}

owned_elsewhere() {  # another installer pod installed after this one (a rollout's new pod)
    owner=$(cat "$HOST_ROOT$OWNER" 2>/dev/null) || return 1
    [ -n "$owner" ] && [ "$owner" != "$TOKEN" ]
}

uninstall_node() {
    rm -f "$READY_FILE"
    stop_refresher
    if owned_elsewhere; then
        say "stopping; nvshim stays installed: a newer installer pod installed it on this node since (a rollout), and uninstalls it when it stops"
        return 0
    fi
    # shellcheck disable=SC2016 # the inner sh expands its own arguments
    on_node sh -c 'rm -f "$1"; rmdir "${1%/*}" 2>/dev/null; true' sh "$NODE_PATHS"
    if [ "$KEEP_ON_EXIT" = true ]; then
        say "stopping; nvshim stays installed on this node (NVSHIM_KEEP_ON_EXIT=true)"
        return 0
    fi
    rc=0
    if [ -f "$HOST_ROOT$STAGE/install.sh" ]; then
        say "uninstalling: sh $STAGE/install.sh --uninstall --purge"
        on_node sh "$STAGE/install.sh" --uninstall --purge || rc=1
    fi
    cur=$HOST_ROOT$ETCDIR/config.yaml
    if [ -e "$cur" ]; then
        if [ -e "$APPLIED" ] && cmp -s "$cur" "$APPLIED"; then
            rm -f "$cur"
        else
            say "kept $ETCDIR/config.yaml: it is not what this installer wrote there"
        fi
    fi
    rm -f "$HOST_ROOT$NEW_CONFIG"  # a check cut short by the signal
    rm -rf "$HOST_ROOT$STAGE" "$HOST_ROOT$STAGE.new"
    rm -f "$HOST_ROOT$OWNER"
    # the hostPath dirs themselves, when empty (removed on the node: here they are mount points)
    on_node rmdir "$ETCDIR" "$(dirname "$STAGE")" 2>/dev/null
    if [ "$rc" = 0 ]; then say "uninstalled nvshim from this node"; fi
    return "$rc"
}

STOP=false sleeper=""
trap 'STOP=true; if [ -n "$sleeper" ]; then kill "$sleeper" 2>/dev/null; fi' TERM INT
install_node
while [ "$STOP" = false ]; do
    sleep "$WATCH_INTERVAL" &
    sleeper=$!
    wait "$sleeper"
    sleeper=""
    [ "$STOP" = false ] || break
    if [ -f "$CONFIGMAP_FILE" ] && ! cmp -s "$CONFIGMAP_FILE" "$SEEN"; then
        if [ "$INSTALLED" = true ]; then apply_config; else install_node; fi
    fi
done
uninstall_node
