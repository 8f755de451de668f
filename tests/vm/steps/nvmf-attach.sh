#!/bin/sh
# talon attach nvme-tcp against a kernel nvmet target in the guest (brd ramdisk, port on 127.0.0.1):
# data written through /dev/talon/<vol> is read back from the ramdisk; a second attach reuses the
# controller; detach leaves no controller; wrong NQN and a closed port fail fast leaving nothing.
# vm-timeout: 150
set -u
NQN=nqn.2025-01.io.talon:vol:gv1
VOL=gv1
CFG=/sys/kernel/config/nvmet
S=$CFG/subsystems/$NQN
P=$CFG/ports/7
PORT=4420
fail=0
check() { if "$@"; then :; else echo "FAILED: $*"; fail=1; fi; }
ctrls() { for c in /sys/class/nvme/nvme*; do [ "$(cat $c/transport 2>/dev/null)" = tcp ] && basename $c; done; }
up() { cut -d' ' -f1 /proc/uptime; }
el() { awk -v a="$1" -v b="$(up)" 'BEGIN{printf "%.2f", b-a}'; }

# ---- target: 64 MiB brd ramdisk (loaded by init with defaults; use ram0) exported over TCP
[ -b /dev/ram0 ] || { rmmod brd 2>/dev/null; modprobe brd rd_nr=1 rd_size=65536; }
mkdir $S && echo 1 >$S/attr_allow_any_host && mkdir $S/namespaces/1 &&
	echo -n /dev/ram0 >$S/namespaces/1/device_path && echo 1 >$S/namespaces/1/enable || { echo "nvmet subsystem setup failed"; exit 1; }
mkdir $P && echo tcp >$P/addr_trtype && echo ipv4 >$P/addr_adrfam && echo 127.0.0.1 >$P/addr_traddr &&
	echo $PORT >$P/addr_trsvcid && ln -s $S $P/subsystems/$NQN || { echo "nvmet port setup failed"; exit 1; }
cleanup_target() {
	rm -f $P/subsystems/$NQN; rmdir $P 2>/dev/null
	echo 0 >$S/namespaces/1/enable 2>/dev/null; rmdir $S/namespaces/1 $S 2>/dev/null
}
trap cleanup_target EXIT

export TALON_DATA_DIR=/tmp/talon-data
echo "--- attach"
T=$(up)
OUT=$(talon attach nvme-tcp --volume $VOL --traddr 127.0.0.1 --trsvcid $PORT --nqn $NQN 2>&1)
rc=$?
echo "$OUT (rc=$rc, $(el $T)s)"
check [ $rc = 0 ]
check [ -b /dev/talon/$VOL ]
DEV=$(echo "$OUT" | sed -n 's/.*device=\(\/dev\/[a-z0-9]*\).*/\1/p')
CTRL=$(echo "$OUT" | grep "^device=" | sed -n 's/.*controller=\(nvme[0-9]*\).*/\1/p')
echo "device $DEV controller $CTRL hostnqn=$(cat /tmp/talon-data/nvme/hostnqn 2>/dev/null)"
Q=$(dmesg | grep "$CTRL: mapped" | tail -1)
echo "kernel: $Q"
# nr_io_queues is capped at talon's default of 4 (the guest has 2 CPUs, so expect <= 4)
check [ -n "$Q" ]
check [ "$(stat -c %t:%T /dev/talon/$VOL)" = "$(stat -c %t:%T $DEV)" ]
check [ "$(cat /sys/class/nvme/$CTRL/subsysnqn)" = $NQN ]
echo "controller address: $(cat /sys/class/nvme/$CTRL/address) state $(cat /sys/class/nvme/$CTRL/state)"
echo "namespace devices under $CTRL (nvmeXcYnZ = native multipath path): $(ls /sys/class/nvme/$CTRL | grep '^nvme' | tr '\n' ' ')"
dmesg | grep -E 'nvme|nvmet' | tail -4

echo "--- data through /dev/talon/$VOL, read back from the ramdisk"
dd if=/dev/urandom of=/tmp/pattern bs=1M count=4 2>/dev/null
check dd if=/tmp/pattern of=/dev/talon/$VOL bs=1M count=4 seek=1 oflag=direct 2>/dev/null
A=$(md5sum </tmp/pattern | cut -c1-32)
B=$(dd if=/dev/ram0 bs=1M skip=1 count=4 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
echo "md5 written=$A ramdisk=$B"
check [ "$A" = "$B" ]

echo "--- second attach reuses the live controller"
OUT2=$(talon attach nvme-tcp --volume $VOL --traddr 127.0.0.1 --trsvcid $PORT --nqn $NQN 2>&1)
echo "$OUT2"
# the result line (log lines name the controller too, now without colour codes)
check [ "$(echo "$OUT2" | grep '^device=' | sed -n 's/.*controller=\(nvme[0-9]*\).*/\1/p')" = "$CTRL" ]
echo "$OUT2" | grep -q reused=true || { echo "FAILED: not reused"; fail=1; }
check [ "$(ctrls | wc -l)" = 1 ]

echo "--- detach"
T=$(up)
talon detach nvme-tcp --volume $VOL; rc=$?
echo "detach rc=$rc ($(el $T)s); tcp controllers left: [$(ctrls)]"
check [ $rc = 0 ]
check [ -z "$(ctrls)" ]
check [ ! -e /dev/talon/$VOL ]
for c in /sys/class/nvme-fabrics/ctl/nvme*; do
	[ -e "$c" ] && [ "$(cat $c/subsysnqn 2>/dev/null)" = $NQN ] && { echo "FAILED: $c still there"; fail=1; }
done
check talon detach nvme-tcp --volume $VOL

echo "--- wrong NQN fails fast, leaves nothing"
T=$(up)
talon attach nvme-tcp --volume bad1 --traddr 127.0.0.1 --trsvcid $PORT --nqn nqn.2025-01.io.talon:vol:nope; rc=$?
echo "rc=$rc after $(el $T)s; tcp controllers: [$(ctrls)]"
check [ $rc != 0 ]
check [ -z "$(ctrls)" ]
check [ ! -e /dev/talon/bad1 ]

echo "--- closed port fails fast, leaves nothing"
T=$(up)
talon attach nvme-tcp --volume bad2 --traddr 127.0.0.1 --trsvcid 4999 --nqn $NQN; rc=$?
echo "rc=$rc after $(el $T)s; tcp controllers: [$(ctrls)]"
check [ $rc != 0 ]
check [ -z "$(ctrls)" ]

echo "--- a target that accepts TCP but never answers the ICReq: bounded by --connect-timeout"
# stdin from a fifo held open by this shell: nc keeps the connection open and silent
mkfifo /tmp/nc.in
exec 5<>/tmp/nc.in
nc -l -p 4998 </tmp/nc.in >/tmp/nc.out 2>&1 &
NC=$!
sleep 0.2
T=$(up)
talon attach nvme-tcp --volume hang --traddr 127.0.0.1 --trsvcid 4998 --nqn $NQN --connect-timeout 2 2>&1 | tee /tmp/hang.err
echo "after $(el $T)s; ICReq bytes the listener got: $(wc -c </tmp/nc.out)"
grep -q 'did not finish within' /tmp/hang.err || { echo "FAILED: no timeout error"; fail=1; }
kill $NC 2>/dev/null; wait $NC 2>/dev/null; exec 5>&-
i=0; while [ -n "$(ctrls)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
echo "tcp controllers: [$(ctrls)]"
check [ -z "$(ctrls)" ]
check [ ! -e /dev/talon/hang ]

echo "--- option injection through the volume name is refused"
talon attach nvme-tcp --volume 'x,traddr=1.2.3.4' --traddr 127.0.0.1 --trsvcid $PORT --nqn $NQN; rc=$?
check [ $rc != 0 ]
talon attach nvme-tcp --volume x --traddr 127.0.0.1 --trsvcid $PORT --nqn "$NQN,nr_io_queues=128"; rc=$?
check [ $rc != 0 ]
check [ -z "$(ctrls)" ]

echo "--- target goes away while attached: detach still disconnects, bounded"
talon attach nvme-tcp --volume gv2 --traddr 127.0.0.1 --trsvcid $PORT --nqn $NQN --ctrl-loss-tmo 30 || fail=1
C2=$(ctrls | head -1)
rm $P/subsystems/$NQN
i=0; while [ "$(cat /sys/class/nvme/$C2/state 2>/dev/null)" = live ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "controller $C2 state after the port went away: $(cat /sys/class/nvme/$C2/state 2>/dev/null)"
T=$(up)
talon detach nvme-tcp --volume gv2; rc=$?
echo "detach rc=$rc after $(el $T)s; tcp controllers: [$(ctrls)]"
check [ $rc = 0 ]
check [ -z "$(ctrls)" ]
check [ ! -e /dev/talon/gv2 ]
ln -s $S $P/subsystems/$NQN

echo "--- target vanishes during attach: namespace disabled, attach times out and disconnects"
echo 0 >$S/namespaces/1/enable
T=$(up)
talon attach nvme-tcp --volume gone --traddr 127.0.0.1 --trsvcid $PORT --nqn $NQN --namespace-timeout 2; rc=$?
echo "rc=$rc after $(el $T)s; tcp controllers: [$(ctrls)]"
check [ $rc != 0 ]
check [ -z "$(ctrls)" ]
check [ ! -e /dev/talon/gone ]
exit $fail
