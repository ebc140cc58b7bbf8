"""Files the appliance image carries besides Debian and the venv (docs/images.md).

Each entry is ``(path in the image, mode, text)``; ``build.py`` writes them into the root
filesystem before the venv is made. They are plain text here so the image's behaviour at boot
is reviewable in one place.
"""

from __future__ import annotations

VENV = "/opt/topicwire"
RUN_DIR = "/run/topicwire/config"
"""Where the boot-time config lands (the config disk's files, copied): topicwire.toml and
what it names (key files, tokens) beside it."""
DEFAULT_DIR = "/etc/topicwire/default"
"""The config baked in by ``--role`` (used when no config disk and no kernel word)."""
CONFIG_LABEL = "APPCFG"
ROOT_LABEL = "approot"
"""The root filesystem's label: the fstab and the kernel command line (``root=LABEL=approot``)
find it by that, so the same image boots from a virtio disk (/dev/vda), SATA (/dev/sda) or
NVMe (/dev/nvme0n1)."""
STATE_LABEL = "appstate"
STATE_DIR = "/var/lib/topicwire/state"
"""Where the optional state disk (ext4 labelled appstate) is mounted before the appliance
starts: point the config's directories that must survive an image replacement there
(``mqtt.state_dir``, ``[telemetry] dir``, a bridge's ``backlog_dir``)."""
MGMT_PORT = 8470
CLIENT_PORT = 47471
MQTT_PORT = 1883
SHUTDOWN_EXIT_CODE = 10
"""``topicwire run --shutdown-exit-code``: the appliance's exit code after the management API's
``shutdown`` command. The unit powers the guest off on it (``ExecStopPost``), and only on it:
a crash is restarted, a ``systemctl stop`` or ``restart`` leaves the guest running."""
ADDRESS_WAIT_S = 15
"""How long the unit waits for an address its config listens on (networkd configures it)."""
READY_MARKER = "topicwire: appliance "
"""``topicwire run`` prints ``topicwire: appliance NAME (id N) ready`` once it serves."""

USB_WAIT_S = 20
"""How long the config unit waits for a USB stick's disk (labelled APPCFG) once a USB
mass-storage device is attached (bare metal: the config on a stick)."""

CONFIG_SCRIPT = r"""#!/bin/sh
# topicwire-config: put the appliance's config in /run/topicwire/config, from (first found)
# a disk labelled APPCFG, the kernel word topicwire.config=<base64 of a TOML>, or the image's
# default (/etc/topicwire/default). *.network files on the disk go to /run/systemd/network.
set -u
out=/run/topicwire/config
mkdir -p "$out" /run/topicwire/disk /run/systemd/network
src=""
find_disk() { blkid -t LABEL=APPCFG -o device 2>/dev/null | head -n 1; }
usb_storage() {
    # a USB mass-storage interface (class 08) is attached: its disk may not be probed yet
    for c in /sys/bus/usb/devices/*/bInterfaceClass; do
        [ "$(cat "$c" 2>/dev/null)" = 08 ] && return 0
    done
    return 1
}
dev=$(find_disk)
if [ -z "$dev" ] && usb_storage; then
    # a USB stick's disk appears after usb-storage's settle delay (1 s) and its SCSI scan
    echo "topicwire-config: a USB storage device is attached: waiting (at most USB_WAIT_S s)" \
         "for a disk labelled APPCFG"
    n=0
    while [ -z "$dev" ] && [ "$n" -lt $((USB_WAIT_S * 4)) ]; do
        sleep 0.25
        n=$((n + 1))
        dev=$(find_disk)
    done
fi
if [ -n "$dev" ]; then
    if mount -o ro "$dev" /run/topicwire/disk; then
        cp -r /run/topicwire/disk/. "$out"/
        umount /run/topicwire/disk
        src="config disk $dev"
    else
        echo "topicwire-config: cannot mount the config disk $dev"
        exit 1
    fi
fi
if [ -z "$src" ]; then
    word=$(tr ' ' '\n' </proc/cmdline | sed -n 's/^topicwire\.config=//p' | head -n 1)
    if [ -n "$word" ]; then
        printf '%s' "$word" | base64 -d >"$out/topicwire.toml" || exit 1
        src="kernel command line (topicwire.config=)"
    fi
fi
if [ -z "$src" ]; then
    cp -r /etc/topicwire/default/. "$out"/
    src="the image's default config (/etc/topicwire/default)"
fi
if [ ! -f "$out/topicwire.toml" ]; then
    echo "topicwire-config: no topicwire.toml in $src"
    exit 1
fi
for f in "$out"/*.network; do
    [ -f "$f" ] && cp "$f" /run/systemd/network/
done
echo "topicwire-config: config from $src"
if [ -d /sys/firmware/efi ]; then
    echo "topicwire-config: booted through UEFI firmware (the EFI system partition's loader)"
fi
""".replace("USB_WAIT_S", str(USB_WAIT_S))

STATE_SCRIPT = r"""#!/bin/sh
# topicwire-state: the state disk (an ext4 filesystem labelled appstate, any disk) checked
# (fsck.ext4 -p) and mounted at STATE_DIR before the appliance starts, so the state the config
# keeps there survives an image replacement. No such disk: nothing is mounted, unless the
# config names STATE_DIR, in which case the appliance must not start (it would write its
# state onto the root disk, to be lost at the next upgrade).
set -u
mnt=STATE_DIR
config=/run/topicwire/config/topicwire.toml
mkdir -p "$mnt"
dev=$(blkid -t LABEL=STATE_LABEL -o device 2>/dev/null | head -n 1)
if [ -z "$dev" ]; then
    if grep -q "$mnt" "$config" 2>/dev/null; then
        echo "topicwire-state: the config names $mnt but no disk labelled STATE_LABEL" \
             "is attached; attach the state disk (an ext4 filesystem:" \
             "mkfs.ext4 -L STATE_LABEL DEVICE) or point the config elsewhere:" \
             "the appliance does not start"
        exit 1
    fi
    echo "topicwire-state: no state disk (label STATE_LABEL);" \
         "the appliance's state is on the root disk"
    exit 0
fi
fsck.ext4 -p "$dev" >/dev/null 2>&1
rc=$?
if [ "$rc" -ge 4 ]; then
    echo "topicwire-state: the state disk $dev has errors fsck.ext4 -p cannot repair" \
         "(exit $rc): repair it (fsck.ext4 $dev) or attach another; the appliance does not start"
    exit 1
fi
if ! mount -t ext4 -o rw,noatime "$dev" "$mnt"; then
    echo "topicwire-state: cannot mount the state disk $dev (label STATE_LABEL; ext4 expected)" \
         "at $mnt: the appliance does not start"
    exit 1
fi
echo "topicwire-state: state disk $dev at $mnt"
""".replace("STATE_DIR", STATE_DIR).replace("STATE_LABEL", STATE_LABEL)

RXE_SCRIPT = r"""#!/bin/sh
# topicwire-rxe: soft-RoCE (rdma_rxe) when this machine has no RDMA device of its own, on the
# NIC that carries the config's fabric address (an RDMA neighbour's `rdma_local`, else
# `fabric.listen`: docs/rdma.md), waiting (at most ADDRESS_WAIT_S s) for systemd-networkd
# to set it; on the first NIC when the config names no specific fabric address.
if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
    echo "topicwire-rxe: RDMA device present: $(ls /sys/class/infiniband | tr '\n' ' ')"
    exit 0
fi
config=/run/topicwire/config/topicwire.toml
modprobe rdma_rxe || { echo "topicwire-rxe: modprobe rdma_rxe failed"; exit 0; }
# rdma_local = "IP" in any table before [fabric]'s listen = "IP:PORT"
want=$(awk '
    /^[[:space:]]*\[/ { sec = $0; gsub(/[[:space:]]|\[|\]/, "", sec) }
    /^[[:space:]]*rdma_local[[:space:]]*=/ && match($0, /"[0-9.]+"/) {
        print 1, substr($0, RSTART + 1, RLENGTH - 2) }
    sec == "fabric" && /^[[:space:]]*listen[[:space:]]*=/ && match($0, /"[0-9.]+:/) {
        print 2, substr($0, RSTART + 1, RLENGTH - 2) }' "$config" 2>/dev/null |
    sort -s -k 1,1n | awk '$2 != "0.0.0.0" && $2 !~ /^127\./ { print $2; exit }')
dev=""
if [ -n "$want" ]; then
    deadline=$(( $(date +%s) + ADDRESS_WAIT_S ))
    until dev=$(ip -o -4 addr show to "$want/32" | awk '{ print $2; exit }'); [ -n "$dev" ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "topicwire-rxe: no NIC has the fabric address $want after ADDRESS_WAIT_S s"
            exit 0
        fi
        sleep 0.2
    done
else
    for n in /sys/class/net/*; do
        n=${n##*/}
        [ "$n" = lo ] && continue
        [ -e "/sys/class/net/$n/device" ] && { dev=$n; break; }
    done
fi
if [ -z "$dev" ]; then
    echo "topicwire-rxe: rdma_rxe loaded; no NIC to put it on"
    exit 0
fi
rdma link add rxe0 type rxe netdev "$dev" &&
    echo "topicwire-rxe: rxe0 on $dev${want:+ (the fabric address $want)}"
exit 0
""".replace("ADDRESS_WAIT_S", str(ADDRESS_WAIT_S))

WAIT_SCRIPT = r"""#!/bin/sh
# topicwire-wait: before `topicwire run`, wait (at most ADDRESS_WAIT_S s) for what its config
# needs of the system and nothing else: each specific IPv4 address a `listen = "IP:PORT"`
# names (systemd-networkd sets them from the config disk's *.network files), and an RDMA
# device when the config mentions rdma (topicwire-rxe makes one). A wildcard or loopback
# listener needs nothing: the appliance starts at once instead of after the whole network.
config="$1"
deadline=$(( $(date +%s) + ADDRESS_WAIT_S ))
sp='[[:space:]]*'
ips=$(sed -n "s/^${sp}[a-z_]*listen${sp}=${sp}\"\([0-9.]*\):[0-9]*\".*/\1/p" "$config")
for ip in $(printf '%s\n' $ips | sort -u); do
    case "$ip" in 0.0.0.0|127.*) continue ;; esac
    until ip -o -4 addr show to "$ip/32" | grep -q .; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "topicwire-wait: no address $ip after ADDRESS_WAIT_S s"; break
        fi
        sleep 0.2
    done
done
if grep -q 'rdma' "$config"; then
    until [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "topicwire-wait: no RDMA device after ADDRESS_WAIT_S s"; break
        fi
        sleep 0.2
    done
fi
exit 0
""".replace("ADDRESS_WAIT_S", str(ADDRESS_WAIT_S))

CONFIG_UNIT = """[Unit]
Description=topicwire: the appliance's config (APPCFG disk, kernel command line, or default)
DefaultDependencies=no
# the config disk is a virtio disk like the root: probed (its /dev node made) by the initramfs
# before the root was mounted, which the kernel mounts read-write (`rw`): nothing else to wait
# for, so the config is there early and the appliance can start beside the rest of the boot
After=systemd-remount-fs.service systemd-journald.socket
Before=systemd-networkd.service topicwire.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/topicwire-config
StandardOutput=journal+console
StandardError=journal+console
"""

STATE_UNIT = f"""[Unit]
Description=topicwire: the state disk (label {STATE_LABEL}) at {STATE_DIR}
DefaultDependencies=no
# reads the config (does it name {STATE_DIR}?); the disk's /dev node: as the config disk's
After=topicwire-config.service systemd-remount-fs.service systemd-journald.socket
Requires=topicwire-config.service
Before=topicwire.service
Conflicts=shutdown.target
Before=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/topicwire-state
StandardOutput=journal+console
StandardError=journal+console
"""

RXE_UNIT = """[Unit]
Description=topicwire: soft-RoCE (rdma_rxe) when there is no RDMA device
# the appliance does not wait for it unless its config names rdma (topicwire-wait); it reads
# the config for the fabric address, whose NIC it puts rxe0 on
After=topicwire-config.service systemd-networkd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/topicwire-rxe
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
"""

def _mount_unit(path: str) -> str:
    return path.strip("/").replace("-", "\\x2d").replace("/", "-") + ".mount"


APPLIANCE_UNIT = f"""[Unit]
Description=topicwire appliance (config: {RUN_DIR}/topicwire.toml)
Requires=topicwire-config.service topicwire-state.service
# not after sysinit.target and basic.target (the early units of a Debian boot take tens of
# seconds under TCG, and Python's start-up is most of the boot): started once its config is
# there, beside them; not after the network as a whole: topicwire-wait waits for the
# addresses the config names
DefaultDependencies=no
After=topicwire-config.service topicwire-state.service systemd-journald.socket
# stopped (drained, its state written) before the state disk is unmounted at power-off
After={_mount_unit(STATE_DIR)}
# what the default dependencies gave for stopping: stopped (drained) before the power-off
Conflicts=shutdown.target
Before=shutdown.target
# its lines (ready, a refused config) reach the serial console before a login prompt does
Before=getty.target serial-getty@ttyS0.service

[Service]
Type=exec
WorkingDirectory={RUN_DIR}
ExecStartPre=/usr/local/sbin/topicwire-wait {RUN_DIR}/topicwire.toml
ExecStart={VENV}/bin/topicwire run --config {RUN_DIR}/topicwire.toml \\
    --shutdown-exit-code {SHUTDOWN_EXIT_CODE}
ExecReload=/bin/kill -HUP $MAINPID
# the management API's shutdown command (POST /shutdown) ends the run with exit code
# {SHUTDOWN_EXIT_CODE}: a clean end (no restart) that powers the guest off; a crash (any other
# code, a signal) is restarted as before and never powers off
SuccessExitStatus={SHUTDOWN_EXIT_CODE}
ExecStopPost=/bin/sh -c 'if [ "$$EXIT_STATUS" = {SHUTDOWN_EXIT_CODE} ]; then \\
    echo "topicwire: shutdown through the management API: powering off"; \\
    systemctl --no-block poweroff; fi'
KillSignal=SIGTERM
TimeoutStopSec=15
StandardOutput=journal+console
StandardError=journal+console
# exit 2 is a config the appliance refused (the console and journal name the key): the
# appliance never starts half-configured, and restarting cannot help
Restart=on-failure
RestartSec=2
RestartPreventExitStatus=2 {SHUTDOWN_EXIT_CODE}
# the compiled kernels the build warmed for a generic x86-64 CPU (NUMBA_CPU_NAME is part of
# the cache's digest: the same value here as at the build)
Environment=NUMBA_CACHE_DIR=/var/cache/topicwire/numba NUMBA_CPU_NAME=generic
Environment=PYTHONUNBUFFERED=1
LimitNOFILE=65536
LimitMEMLOCK=infinity

[Install]
WantedBy=multi-user.target
"""

NETWORK_DEFAULT = """# the image's default: DHCP on every Ethernet NIC (QEMU's user net answers).
# A config disk's *.network files (e.g. 10-fabric.network) come first (sorted by name).
[Match]
Name=eth* en*

[Network]
DHCP=ipv4
LinkLocalAddressing=no
IPv6AcceptRA=no
"""

RDMA_MODULES = """# the image's: verbs from user space (ib_uverbs) and the RDMA connection manager,
# loaded by rdma-core's udev rules when an RDMA device appears; not rdma-core's default list (iSER,
# NFS over RDMA), whose module loads under TCG compete with the appliance's start for seconds
ib_uverbs
rdma_ucm
"""

FSTAB = f"LABEL={ROOT_LABEL} / ext4 rw,relatime 0 1\n"


def default_config(role: str) -> str:
    """The config ``--role`` bakes in: a standalone appliance of that role, its management
    API and client port on every address (reached through QEMU's forwarded loopback ports)."""
    name = f"{role}1"
    return f"""# the image's default config (topicwire image build --role {role}); a config disk
# labelled APPCFG with a topicwire.toml replaces it (docs/images.md)
[appliance]
name = "{name}"
role = "{role}"

[clients]
udp = "0.0.0.0:{CLIENT_PORT}"

[mgmt]
listen = "0.0.0.0:{MGMT_PORT}"
""" + (f"""
# MQTT devices connect here (docs/mqtt.md); each logs in as a P&M identity with a password
[mqtt]
listen = "0.0.0.0:{MQTT_PORT}"
""" if role == "edge" else "")


def files(role: str) -> list[tuple[str, int, str]]:
    """Every file the build writes into the root filesystem."""
    return [
        ("/usr/local/sbin/topicwire-config", 0o755, CONFIG_SCRIPT),
        ("/usr/local/sbin/topicwire-rxe", 0o755, RXE_SCRIPT),
        ("/usr/local/sbin/topicwire-wait", 0o755, WAIT_SCRIPT),
        ("/usr/local/sbin/topicwire-state", 0o755, STATE_SCRIPT),
        ("/etc/rdma/modules/rdma.conf", 0o644, RDMA_MODULES),
        ("/etc/systemd/system/topicwire-config.service", 0o644, CONFIG_UNIT),
        ("/etc/systemd/system/topicwire-rxe.service", 0o644, RXE_UNIT),
        ("/etc/systemd/system/topicwire-state.service", 0o644, STATE_UNIT),
        ("/etc/systemd/system/topicwire.service", 0o644, APPLIANCE_UNIT),
        ("/usr/lib/systemd/network/99-topicwire-default.network", 0o644, NETWORK_DEFAULT),
        (f"{DEFAULT_DIR}/topicwire.toml", 0o644, default_config(role)),
        ("/etc/fstab", 0o644, FSTAB),
        ("/etc/hostname", 0o644, "topicwire\n"),
    ]
