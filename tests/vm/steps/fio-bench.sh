#!/bin/sh
# benches/fio/run.sh (the standard fio set, 2 s per job) on /dev/talon/<vol> attached over NVMe/TCP
# from an in-guest nvmet target (brd ramdisk on 127.0.0.1), as on a real host. Prints the table
# rows (TCG numbers: indicative only) and one "fio-result <json>" line per job for the host check.
# vm-timeout: 120
set -u
NQN=nqn.2025-01.io.talon:vol:fiobench
VOL=fiobench
S=/sys/kernel/config/nvmet/subsystems/$NQN
P=/sys/kernel/config/nvmet/ports/9
PORT=4422
[ -n "${TALON_HOST_FIO_BUNDLE:-}" ] || { echo "no TALON_HOST_FIO_BUNDLE from fio-bench.host"; exit 1; }
mkdir -p /tmp/fio && echo "$TALON_HOST_FIO_BUNDLE" | base64 -d | tar -C /tmp/fio -xz || { echo "cannot unpack the fio bundle"; exit 1; }
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
TALON_FIO_RAMP=0 sh /tmp/fio/run.sh --device /dev/talon/$VOL --runtime "${TALON_FIO_RUNTIME:-2}" \
	--label vm-tcg,engine=nvmet-brd,replicas=1,frontend=nvme-tcp --results /tmp/fio-results.jsonl
rc=$?
sed 's/^/fio-result /' /tmp/fio-results.jsonl
exit $rc
