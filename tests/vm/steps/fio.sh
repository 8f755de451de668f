#!/bin/sh
# fio for a few seconds on /dev/talon/<vol> attached over NVMe/TCP from an in-guest nvmet target:
# proves the path works with fio (TCG numbers are only indicative).
# vm-timeout: 120
set -u
NQN=nqn.2025-01.io.talon:vol:fio1
VOL=fio1
S=/sys/kernel/config/nvmet/subsystems/$NQN
P=/sys/kernel/config/nvmet/ports/8
PORT=4421
[ -b /dev/ram0 ] || modprobe brd rd_nr=1 rd_size=65536
mkdir $S && echo 1 >$S/attr_allow_any_host && mkdir $S/namespaces/1 &&
	echo -n /dev/ram0 >$S/namespaces/1/device_path && echo 1 >$S/namespaces/1/enable &&
	mkdir $P && echo tcp >$P/addr_trtype && echo ipv4 >$P/addr_adrfam && echo 127.0.0.1 >$P/addr_traddr &&
	echo $PORT >$P/addr_trsvcid && ln -s $S $P/subsystems/$NQN || { echo "nvmet setup failed"; exit 1; }
export TALON_DATA_DIR=/tmp/talon-data
cleanup() {
	talon detach nvme-tcp --volume $VOL --nqn $NQN
	rm -f $P/subsystems/$NQN; rmdir $P; echo 0 >$S/namespaces/1/enable; rmdir $S/namespaces/1 $S
}
trap cleanup EXIT
talon attach nvme-tcp --volume $VOL --traddr 127.0.0.1 --trsvcid $PORT --nqn $NQN || exit 1
fio --name=talon-path --filename=/dev/talon/$VOL --rw=randrw --bs=4k --iodepth=16 --ioengine=libaio \
	--direct=1 --runtime=4 --time_based --size=32M --output-format=json >/tmp/fio.json 2>/tmp/fio.err
rc=$?
[ $rc = 0 ] || { echo "fio rc=$rc"; cat /tmp/fio.err; exit 1; }
R=$(tr -d ' \n' </tmp/fio.json | sed -n 's/.*"read":{"io_bytes":\([0-9]*\),.*/\1/p')
W=$(tr -d ' \n' </tmp/fio.json | sed -n 's/.*"write":{"io_bytes":\([0-9]*\),.*/\1/p')
E=$(tr -d ' \n' </tmp/fio.json | sed -n 's/.*"error":\([0-9]*\),.*/\1/p')
echo "fio on /dev/talon/$VOL: read_bytes=$R write_bytes=$W error=$E"
grep -E '"iops"' /tmp/fio.json | head -2
[ -n "$R" ] && [ "$R" -gt 0 ] && [ -n "$W" ] && [ "$W" -gt 0 ] && [ "$E" = 0 ]
