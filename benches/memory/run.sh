#!/bin/bash
# What spdk_tgt's objects really use of its DPDK memory (-s), against the per-volume formula
# (benches/memory/README.md).
#
#   for N in $VOLUMES: spdk_tgt (-m 0x1 --no-huge -s $MEM -u) ── aio bdev ── lvstore ── N thin lvols
#       ── TCP transport ── N subsystems (a namespace and a listener each)
#     exported:  env_dpdk_get_mem_stats -> "DPDK malloc stats" Alloc_size (what is in use)
#     connected: spdk_nvme_perf (4 KiB randread QD32) connected to min(N, $CONNECT) of them, Alloc_size
#                again while it runs (TCP qpairs and their buffers)
#
# usage: TALON_SPDK_DIR=/opt/spdk benches/memory/run.sh   (as root; prints a markdown table)
set -euo pipefail
SPDK=${TALON_SPDK_DIR:?set TALON_SPDK_DIR to an SPDK build}
VOLUMES=${VOLUMES:-0 10 50 100}
CONNECT=${CONNECT:-10}
PROGRAMS=${PROGRAMS:-spdk_tgt nvmf_tgt}
MEM=${MEM:-2048}
PORT=${PORT:-14453}
WORK=$(mktemp -d)
TGT=
trap '[ -n "$TGT" ] && { kill -INT $TGT 2>/dev/null; sleep 2; kill -9 $TGT 2>/dev/null; }; rm -rf "$WORK"' EXIT
rpc() { "$SPDK/scripts/rpc.py" -s "$WORK/spdk.sock" "$@"; }
# the heap's bytes in use, MiB; the dump file is in the target's mount namespace (/proc/PID/root)
alloc_mib() {
	local f
	f=$(rpc env_dpdk_get_mem_stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["filename"])')
	awk -F'[:,]' '/DPDK malloc stats/ {s=1} s && /Alloc_size:/ {printf "%.0f", $2/1048576; exit}' "/proc/$TGT/root$f"
}

echo "| target | volumes exported | connected | DPDK heap in use: empty / exported / connected | formula 512 + 43/volume |"
echo "|---|---:|---:|---:|---:|"
for prog in $PROGRAMS; do
for n in $VOLUMES; do
	rm -f "$WORK/spdk.sock" "$WORK/disk.img"
	truncate -s 8G "$WORK/disk.img"
	"$SPDK/build/bin/$prog" -m 0x1 --no-huge -s "$MEM" -u --disable-cpumask-locks -r "$WORK/spdk.sock" \
		>"$WORK/tgt.log" 2>&1 &
	TGT=$!
	for _ in $(seq 100); do [ -S "$WORK/spdk.sock" ] && rpc spdk_get_version >/dev/null 2>&1 && break; sleep 0.1; done
	base=$(alloc_mib)
	{
		echo "bdev_aio_create $WORK/disk.img d0 4096"
		echo "bdev_lvol_create_lvstore d0 lvs -c 4194304"
		echo "nvmf_create_transport -t TCP"
		for i in $(seq 1 "$n"); do
			echo "bdev_lvol_create -l lvs -t l$i 64"
			echo "nvmf_create_subsystem nqn.2026-11.io.talon.bench:m$i"
			echo "nvmf_subsystem_add_ns nqn.2026-11.io.talon.bench:m$i lvs/l$i"
			echo "nvmf_subsystem_allow_any_host --allow-any-host nqn.2026-11.io.talon.bench:m$i"
			echo "nvmf_subsystem_add_listener nqn.2026-11.io.talon.bench:m$i -t tcp -a 127.0.0.1 -s $PORT"
		done
	} | "$SPDK/scripts/rpc.py" -s "$WORK/spdk.sock" >/dev/null
	exported=$(alloc_mib)
	c=$((n < CONNECT ? n : CONNECT))
	connected=$exported
	if [ "$c" -gt 0 ]; then
		args=()
		for i in $(seq 1 "$c"); do
			args+=(-r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:nqn.2026-11.io.talon.bench:m$i")
		done
		"$SPDK/build/bin/spdk_nvme_perf" --no-huge -s 1024 -c 0x2 -q 32 -o 4096 -w randread -t 8 "${args[@]}" \
			>"$WORK/perf.log" 2>&1 &
		perf=$!
		sleep 5
		connected=$(alloc_mib)
		wait $perf || true
	fi
	printf '| %s | %s | %s | %s / %s / %s MiB | %s MiB |\n' "$prog" "$n" "$c" "$base" "$exported" "$connected" \
		$((512 + 43 * n))
	kill -INT $TGT; wait $TGT 2>/dev/null || true
	TGT=
done
done
