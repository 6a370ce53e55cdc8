#!/bin/sh
# Second stage of a testbed guest's boot (after the initramfs switched to the
# host's root, read-only over 9p with a tmpfs overlay). It loads the RDMA
# stack from the Debian kernel package that `scripts/testbed prepare`
# unpacked, names and addresses the rails, creates the soft-RoCE devices,
# starts Redis on host A, then runs the agent. Parameters come from the
# kernel command line (tb.*) and from the spool share's guest.env.
# Any failure is written to /tb/<host>/failed for the host side to report.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
arg() { sed -n "s/.*[ ]tb\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
H=$(arg host)
KROOT=$(arg kroot)
BUILD=$(arg build)

mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm /tb
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 spool /tb || {
    echo "stage2: cannot mount the spool share" >/dev/console; poweroff -f; }
mkdir -p /tb/$H
exec >/tb/$H/stage2.log 2>&1 </dev/null
set -x
fail() { echo "$*" > /tb/$H/failed; echo "stage2 FAILED: $*" >/dev/console; sleep 2; poweroff -f; }
set +x # (guest.env holds the store's password: not traced into this log)
. /tb/guest.env || fail "no guest.env"
set -x
hostname host$H

# The build tree as its own 9p mount without caching, so a rebuild on the
# host (a new libibverbs.so.1) is seen without rebooting the guest.
if [ -n "$BUILD" ] && [ -d "$BUILD" ]; then
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000 build "$BUILD" || fail "cannot mount build share"
fi

# crc32_generic first: rdma_rxe asks the crypto API for "crc32" without a
# module dependency. modprobe -d resolves the rest (virtio_ring before
# virtio, ib_core before rdma_rxe, ...) from the unpacked package's modules.dep.
for m in crc32_generic virtio_net sch_netem ib_uverbs rdma_rxe configfs iw_cm ib_cm rdma_cm rdma_ucm; do
    modprobe -d "$KROOT" "$m" || fail "modprobe $m"
done
mountpoint -q /sys/kernel/config || mount -t configfs configfs /sys/kernel/config

# Name the NICs by MAC (52:54:00:TB:0h:0r), not by probe order.
for d in /sys/class/net/*; do
    n=${d##*/}; [ "$n" = lo ] && continue
    mac=$(cat $d/address)
    r=${mac##*:}; r=${r#0}
    case "$mac" in 52:54:00:*) ip link set "$n" name "tbtmp$r" ;; esac
done
ip link set lo up
for r in 0 1 2; do
    ip link set tbtmp$r name eth$r || fail "no NIC for eth$r"
    sysctl -q -w net.ipv6.conf.eth$r.disable_ipv6=1
done
if [ "$H" = A ]; then o=1; else o=2; fi
ip addr add 198.18.0.$o/24 dev eth0
ip addr add 198.18.1.$o/24 dev eth1
ip addr add 198.19.0.$o/24 dev eth2
for r in 0 1 2; do ip link set eth$r up || fail "link up eth$r"; done
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0"
rdma link add rxe1 type rxe netdev eth1 || fail "rdma link add rxe1"

# (no trace while the password is on a command line: it stays out of
# stage2.log, which tests/tools/no_secrets.sh checks)
set +x
# the job secret of scenarios with authenticated records
# (SHIFT_KV_SECRET_FILE=/run/shift-e2e.secret): the same on both guests
(umask 077; printf '%s' "$TB_REDIS_PASSWORD" | sha256sum | cut -c1-64 > /run/shift-e2e.secret) ||
    fail "secret file"

if [ "$H" = A ]; then
    # protected mode refuses remote clients without a password: give it one
    redis-server --bind 198.19.0.1 --port 6379 --requirepass "$TB_REDIS_PASSWORD" \
        --save "" --appendonly no --daemonize yes --dir /run \
        --logfile /tb/A/redis.log --pidfile /run/redis.pid || fail "redis-server"
fi
set -x
rdma link show
ip -br addr

python3 "$(dirname "$0")/agent.py" --spool /tb/$H --idle-timeout "$TB_IDLE_TIMEOUT"
echo "agent exited rc=$?"
sync
poweroff -f
