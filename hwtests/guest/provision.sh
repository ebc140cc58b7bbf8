#!/bin/sh
# soft-RoCE for topicwire's hardware tests: the one provisioning script behind both launchers.
#
#   hwtests/guest/launch.py (make hwtest, make bench-rdma) runs `provision.sh --devices` inside
#   its QEMU guest; the Vagrantfile runs `provision.sh --packages --devices --nic auto --persist`
#   inside the box. Either way the machine ends up with:
#
#     rxe0 on veth rdma-v0 (192.168.200.1/24)  <->  rxe1 on veth rdma-v1 (192.168.200.2/24)
#
#   two soft-RoCE devices on the two ends of a veth pair in the root namespace (rxe's UDP 4791
#   socket lives only there on Linux 6.1, so network namespaces cannot separate them), which is
#   what hwtests/rdma expects. Nothing on the pair leaves the machine.
#
# Options (any order; at least one):
#   --packages        apt-get install the RDMA userland below (needs a network and apt)
#   --devices         load rdma_rxe and make the veth pair and rxe0/rxe1 (idempotent)
#   --nic IFACE       also put soft-RoCE on IFACE (device rxe_IFACE), to reach other machines;
#                     `--nic auto` picks the interface of the default route (a Vagrant box's NIC)
#   --persist         install a systemd unit that redoes --devices (and --nic) at every boot
#   --print-packages  print the package list and exit
set -eu

PACKAGES="rdma-core ibverbs-providers ibverbs-utils libibverbs-dev python3-pyverbs perftest iproute2 kmod"
ADDR0=192.168.200.1
ADDR1=192.168.200.2
VETH0=rdma-v0
VETH1=rdma-v1

packages=0; devices=0; nic=""; persist=0
while [ $# -gt 0 ]; do
    case "$1" in
        --packages) packages=1 ;;
        --devices) devices=1 ;;
        --nic) shift; nic="${1:?--nic needs an interface}" ;;
        --persist) persist=1 ;;
        --print-packages) echo "$PACKAGES"; exit 0 ;;
        *) echo "provision.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
    esac
    shift
done
if [ $packages$devices$persist = 000 ] && [ -z "$nic" ]; then
    echo "provision.sh: nothing to do; give --packages, --devices, --nic IFACE or --persist" >&2
    exit 2
fi

say() { echo "provision: $*"; }

if [ $packages = 1 ]; then
    missing=""
    for p in $PACKAGES; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        say "installing$missing"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
    fi
fi

rxe_on() {  # rxe_on DEVICE NETDEV: soft-RoCE device DEVICE on NETDEV unless one is there
    if rdma link show 2>/dev/null | grep -q "netdev $2\( \|$\)"; then
        return 0
    fi
    rdma link add "$1" type rxe netdev "$2"
}

if [ $devices = 1 ] || [ -n "$nic" ]; then
    modprobe rdma_rxe || { echo "provision.sh: this kernel has no rdma_rxe module (CONFIG_RDMA_RXE); boot one that has (Debian's linux-image-amd64 does)" >&2; exit 1; }
fi

if [ $devices = 1 ]; then
    ip link set lo up
    if ! ip link show "$VETH0" >/dev/null 2>&1; then
        ip link add "$VETH0" type veth peer name "$VETH1"
        ip addr add "$ADDR0/24" dev "$VETH0"
        ip addr add "$ADDR1/24" dev "$VETH1"
    fi
    ip link set "$VETH0" up
    ip link set "$VETH1" up
    # packets between two local addresses need accept_local, or the neighbour of the other
    # end never resolves and moving a queue pair to RTR fails (rp_filter must stay 0 or 2)
    sysctl -qw net.ipv4.conf.all.accept_local=1
    rxe_on rxe0 "$VETH0"
    rxe_on rxe1 "$VETH1"
fi

if [ "$nic" = auto ]; then
    nic=$(ip -o route show default | sed -n 's/.* dev \([^ ]*\).*/\1/p' | head -n 1)
    [ -n "$nic" ] || { echo "provision.sh: --nic auto: no default route, so no NIC to pick; name one" >&2; exit 1; }
    say "--nic auto: $nic"
fi

if [ -n "$nic" ]; then
    ip link set "$nic" up
    rxe_on "rxe_$nic" "$nic"
fi

if [ $persist = 1 ]; then
    here=$(cd "$(dirname "$0")" && pwd)
    install -D -m 0755 "$here/provision.sh" /usr/local/sbin/topicwire-soft-roce
    args="--devices"
    [ -n "$nic" ] && args="$args --nic $nic"
    cat > /etc/systemd/system/topicwire-soft-roce.service <<UNIT
[Unit]
Description=soft-RoCE devices for topicwire (rxe0/rxe1 on a veth pair${nic:+, rxe_$nic})
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/topicwire-soft-roce $args

[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
    systemctl enable topicwire-soft-roce.service >/dev/null
    say "topicwire-soft-roce.service enabled (redoes $args at boot)"
fi

if [ $devices = 1 ] || [ -n "$nic" ]; then
    say "soft-RoCE ready:"
    rdma link show | sed 's/^/provision:   /'
fi
