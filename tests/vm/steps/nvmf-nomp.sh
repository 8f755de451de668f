#!/bin/sh
# The same attach without native NVMe multipath (nvme_core multipath=N): the namespace is the
# plain nvmeXnY under the controller instead of a hidden nvmeXcYnZ path. Reloads the NVMe host
# modules and puts them back (multipath on) at the end, so other steps see the usual guest.
# vm-timeout: 90
set -u
NQN=nqn.2025-01.io.talon:vol:nomp1
VOL=nomp1
S=/sys/kernel/config/nvmet/subsystems/$NQN
P=/sys/kernel/config/nvmet/ports/9
PORT=4422
fail=0
ctrls() { for c in /sys/class/nvme/nvme*; do [ "$(cat $c/transport 2>/dev/null)" = tcp ] && basename $c; done; }
reload() { # multipath Y|N
	rmmod nvme_tcp nvme_fabrics nvme nvme_core || return 1
	modprobe nvme_core multipath=$1 && modprobe nvme && modprobe nvme_tcp || return 1
	echo "nvme_core multipath=$(cat /sys/module/nvme_core/parameters/multipath)"
}
reload N || { echo "cannot reload the NVMe modules without multipath"; exit 1; }
[ -b /dev/ram0 ] || modprobe brd rd_nr=1 rd_size=65536
mkdir $S && echo 1 >$S/attr_allow_any_host && mkdir $S/namespaces/1 &&
	echo -n /dev/ram0 >$S/namespaces/1/device_path && echo 1 >$S/namespaces/1/enable &&
	mkdir $P && echo tcp >$P/addr_trtype && echo ipv4 >$P/addr_adrfam && echo 127.0.0.1 >$P/addr_traddr &&
	echo $PORT >$P/addr_trsvcid && ln -s $S $P/subsystems/$NQN || { echo "nvmet setup failed"; fail=1; }
export TALON_DATA_DIR=/tmp/talon-data
OUT=$(talon attach nvme-tcp --volume $VOL --traddr 127.0.0.1 --trsvcid $PORT --nqn $NQN) || fail=1
echo "$OUT"
CTRL=$(echo "$OUT" | grep "^device=" | sed -n 's/.*controller=\(nvme[0-9]*\).*/\1/p')
DEV=$(echo "$OUT" | sed -n 's/.*device=\/dev\/\([a-z0-9]*\).*/\1/p')
echo "namespace devices under $CTRL: $(ls /sys/class/nvme/$CTRL 2>/dev/null | grep '^nvme' | tr '\n' ' ')"
# without multipath the block device sits directly under its controller
[ -n "$DEV" ] && [ -d /sys/class/nvme/$CTRL/$DEV ] || { echo "FAILED: $DEV is not under $CTRL"; fail=1; }
dd if=/dev/urandom of=/tmp/p bs=1M count=1 2>/dev/null
dd if=/tmp/p of=/dev/talon/$VOL bs=1M count=1 oflag=direct 2>/dev/null || fail=1
A=$(md5sum </tmp/p | cut -c1-32)
B=$(dd if=/dev/ram0 bs=1M count=1 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
echo "md5 written=$A ramdisk=$B"
[ "$A" = "$B" ] || fail=1
talon detach nvme-tcp --volume $VOL || fail=1
[ -z "$(ctrls)" ] || { echo "FAILED: controllers left: $(ctrls)"; fail=1; }
[ ! -e /dev/talon/$VOL ] || fail=1
rm -f $P/subsystems/$NQN; rmdir $P; echo 0 >$S/namespaces/1/enable; rmdir $S/namespaces/1 $S
reload Y || fail=1
i=0; while ! ls /sys/block | grep -q '^nvme0n1$' && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "after restoring multipath: $(ls /sys/block | grep nvme | tr '\n' ' ')"
exit $fail
