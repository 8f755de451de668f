#!/bin/bash
# Idle CPU and 4 KiB random-read IOPS of the SPDK target with talon's usual objects, in polling
# and in interrupt mode (benches/interrupt/README.md).
#
#   for each mode: target (-m 0x1 --no-huge -s 1024 -u) ── aio bdev on a sparse file ── lvstore
#       ── 10 thin lvols (lvol 0 and an 11th in a raid1) ── TCP transport ── 10 subsystems + listeners
#     idle:  utime+stime of the target over $IDLE_SECS with no I/O, as % of one core
#     I/O:   spdk_nvme_perf from core 1 (--no-huge), 4 KiB randread, QD1 and QD32, $IO_SECS each
#
# REPEAT=N runs the four modes N times in turn (round-robin, so the machine's load falls on each
# mode alike) and prints a row per run with the 1-minute load average when it was measured.
#
# usage: TALON_SPDK_DIR=/opt/spdk benches/interrupt/run.sh   (as root; prints a markdown table)
set -euo pipefail
SPDK=${TALON_SPDK_DIR:?set TALON_SPDK_DIR to an SPDK build}
IDLE_SECS=${IDLE_SECS:-10}
IO_SECS=${IO_SECS:-5}
PORT=${PORT:-14433}
REPEAT=${REPEAT:-1}
WORK=$(mktemp -d)
trap 'kill -INT $TGT 2>/dev/null; sleep 2; kill -9 $TGT 2>/dev/null; rm -rf "$WORK"' EXIT
TGT=
rpc() { "$SPDK/scripts/rpc.py" -s "$WORK/spdk.sock" "$@" >/dev/null; }
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }

run_mode() { # label binary args...
	local label=$1 bin=$2; shift 2
	rm -f "$WORK/spdk.sock" "$WORK/disk.img"
	truncate -s 2G "$WORK/disk.img"
	"$SPDK/build/bin/$bin" -m 0x1 --no-huge -s 1024 -u --disable-cpumask-locks -r "$WORK/spdk.sock" "$@" \
		>"$WORK/$bin.log" 2>&1 &
	TGT=$!
	for _ in $(seq 100); do [ -S "$WORK/spdk.sock" ] && rpc spdk_get_version 2>/dev/null && break; sleep 0.1; done
	rpc bdev_aio_create "$WORK/disk.img" d0 4096
	rpc bdev_lvol_create_lvstore d0 lvs -c 1048576
	for i in $(seq 0 10); do rpc bdev_lvol_create -l lvs -t "l$i" 64; done
	rpc bdev_raid_create -n r0 -r raid1 -b "lvs/l0 lvs/l10"
	rpc nvmf_create_transport -t TCP
	for i in $(seq 0 9); do
		local nqn="nqn.2026-11.io.talon.bench:v$i" bdev="lvs/l$i"
		[ "$i" = 0 ] && bdev=r0
		rpc nvmf_create_subsystem "$nqn" -a
		rpc nvmf_subsystem_add_ns "$nqn" "$bdev"
		rpc nvmf_subsystem_add_listener "$nqn" -t tcp -a 127.0.0.1 -s "$PORT"
	done
	sleep 3
	local t0 t1 s0 s1
	t0=$(ticks $TGT); s0=$(date +%s.%N)
	sleep "$IDLE_SECS"
	t1=$(ticks $TGT); s1=$(date +%s.%N)
	local idle
	idle=$(echo "($t1 - $t0) / $(getconf CLK_TCK) / ($s1 - $s0) * 100" | bc -l)
	local qd iops=()
	for qd in 1 32; do
		iops+=("$("$SPDK/build/bin/spdk_nvme_perf" --no-huge -s 512 -c 0x2 -q $qd -o 4096 -w randread -t "$IO_SECS" \
			-r "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:$PORT subnqn:nqn.2026-11.io.talon.bench:v0" 2>/dev/null |
			awk -F: '/^Total/ {split($2, f, " "); printf "%.0f", f[1]}')")
	done
	printf '| %s | %.1f %% | %s | %s | %s |\n' "$label" "$idle" "${iops[0]}" "${iops[1]}" "$(cut -d' ' -f1 /proc/loadavg)"
	kill -INT $TGT; wait $TGT 2>/dev/null || true
	TGT=
}

echo "| target | idle CPU (10 volumes exported) | 4 KiB randread QD1 IOPS | QD32 IOPS | load (1 min) |"
echo "|---|---:|---:|---:|---:|"
for _ in $(seq "$REPEAT"); do
	run_mode "spdk_tgt, polling" spdk_tgt
	run_mode "spdk_tgt --interrupt-mode" spdk_tgt --interrupt-mode
	run_mode "nvmf_tgt, polling" nvmf_tgt
	run_mode "nvmf_tgt --interrupt-mode (talon's choice)" nvmf_tgt --interrupt-mode
done
