#!/bin/sh
# talon attaches a volume exported by talon's V2 engine (SPDK) on the host (guest 10.0.2.2 = host
# 127.0.0.1), writes 2 MiB at offset 1 MiB through /dev/talon/<vol>, reads them back (O_DIRECT) and
# compares, detaches and leaves no controller. Then fio (libaio, direct, 4 KiB random writes, QD16,
# 20 s) on the 2-replica volume vm-snap while the host snapshots it every second: fio must see no
# I/O error (the kernel's NVMe multipath queues I/O while a snapshot freezes the export). Skipped by
# the harness without SPDK.
# vm-timeout: 360
# vm-order: early
set -u
VOL=hostspdk
export TALON_DATA_DIR=/tmp/talon-data
ctrls() { for c in /sys/class/nvme/nvme*; do [ "$(cat $c/transport 2>/dev/null)" = tcp ] && basename $c; done; }
fail=0
# the host identity the host's talon admits (talon uses <data-dir>/nvme/ without /etc/nvme/hostnqn)
[ ! -s /etc/nvme/hostnqn ] || { echo "FAIL: the guest has /etc/nvme/hostnqn; talon would not use the admitted NQN"; exit 1; }
SAVED=$(mktemp -d)
cp -a $TALON_DATA_DIR/nvme/. "$SAVED"/ 2>/dev/null
mkdir -p $TALON_DATA_DIR/nvme
echo "$TALON_HOST_SPDK_GUEST_ID" >$TALON_DATA_DIR/nvme/hostid
echo "nqn.2014-08.org.nvmexpress:uuid:$TALON_HOST_SPDK_GUEST_ID" >$TALON_DATA_DIR/nvme/hostnqn
talon attach nvme-tcp --volume $VOL --traddr "$TALON_HOST_ADDR" --trsvcid "$TALON_HOST_SPDK_NVMF_PORT" \
	--nqn "$TALON_HOST_SPDK_NQN" || exit 1
dd if=/dev/urandom of=/tmp/p bs=1M count=2 2>/dev/null
dd if=/tmp/p of=/dev/talon/$VOL bs=1M seek=1 count=2 oflag=direct 2>/dev/null || fail=1
A=$(md5sum </tmp/p | cut -c1-32)
B=$(dd if=/dev/talon/$VOL bs=1M skip=1 count=2 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
echo "SPDK_MD5=$A read-back=$B"
[ "$A" = "$B" ] || fail=1
talon detach nvme-tcp --volume $VOL || fail=1
[ -z "$(ctrls)" ] || { echo "controllers left: $(ctrls)"; fail=1; }
[ ! -e /dev/talon/$VOL ] || fail=1

SNAP=snapvol
talon attach nvme-tcp --volume $SNAP --traddr "$TALON_HOST_ADDR" --trsvcid "$TALON_HOST_SPDK_NVMF_PORT" \
	--nqn "$TALON_HOST_SPDK_SNAP_NQN" || exit 1
START=$(date +%s)
fio --name=snap --filename=/dev/talon/$SNAP --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio \
	--direct=1 --time_based --runtime=20 >/tmp/snapfio.out 2>/tmp/snapfio.err
RC=$?
END=$(date +%s)
# the write completion latency line, e.g. "clat (usec): min=80, max=61234, avg=..."
CLAT=$(grep -A4 'write:' /tmp/snapfio.out | grep -m1 ' clat ' | tr -s ' ' | sed 's/^ //')
IOPS=$(grep -m1 'write:' /tmp/snapfio.out | sed -n 's/.*IOPS=\([^,]*\),.*/\1/p')
echo "SNAPFIO start=$START end=$END rc=$RC iops=$IOPS clat=[$CLAT]"
[ "$RC" = 0 ] || { cat /tmp/snapfio.err; fail=1; }
talon detach nvme-tcp --volume $SNAP || fail=1

# thin rebuilds (with their switch: the export closes for a moment, the kernel reconnects) under fio
RB=rbvol
# the host's hook starts a rebuild every 15 s: a switch that closes the export while the kernel
# connects fails that connect (after the kernel's admin timeout, up to 60 s: "Property Get
# error"), and the next connect, after the switch, succeeds
attach_rb() {
	talon attach nvme-tcp --volume $RB --traddr "$TALON_HOST_ADDR" --trsvcid "$TALON_HOST_SPDK_NVMF_PORT" \
		--nqn "$TALON_HOST_SPDK_RB_NQN" --connect-timeout 90
}
attach_rb || { echo "attach of $RB failed (a rebuild's switch?): once more"; sleep 3; attach_rb; } || exit 1
START=$(date +%s)
# SIGPIPE ignored (inherited through exec): when a switch closes the export, Debian 6.1's nvme_tcp
# may send a request from the submitting process (io_submit, inline send) without MSG_NOSIGNAL, and
# the socket's EPIPE then signals that process ("nvme nvme1: failed to send request -32", then
# "fio: got signal=13", then fio aborted, once in a rehearsal); fio must still see no I/O error
(trap '' PIPE; exec fio --name=rb --filename=/dev/talon/$RB --rw=randwrite --bs=4k --iodepth=16 --ioengine=libaio \
	--direct=1 --time_based --runtime=40) >/tmp/rbfio.out 2>/tmp/rbfio.err
RC=$?
END=$(date +%s)
IOPS=$(grep -m1 'write:' /tmp/rbfio.out | sed -n 's/.*IOPS=\([^,]*\),.*/\1/p')
dd if=/dev/urandom of=/tmp/rbp bs=1M count=4 2>/dev/null
dd if=/tmp/rbp of=/dev/talon/$RB bs=1M seek=8 count=4 oflag=direct 2>/dev/null || fail=1
A=$(md5sum </tmp/rbp | cut -c1-32)
B=$(dd if=/dev/talon/$RB bs=1M skip=8 count=4 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
echo "RBFIO start=$START end=$END rc=$RC iops=$IOPS md5=$A back=$B"
[ "$RC" = 0 ] || { cat /tmp/rbfio.err; fail=1; }
talon detach nvme-tcp --volume $RB || fail=1
rm -f $TALON_DATA_DIR/nvme/hostid $TALON_DATA_DIR/nvme/hostnqn
cp -a "$SAVED"/. $TALON_DATA_DIR/nvme/ 2>/dev/null
exit $fail
