#!/bin/sh
# A Longhorn `spdk-tcp-blockdev` engine-frontend on the guest's kernel switched over between two
# engines of one volume on two nodes while fio writes with verify through it (NVMe native
# multipath). The host's two talons (node A 10.213.7.2, node B 10.213.7.3, each with its spdk_tgt,
# see longhorn-switch.host) serve a replica each; the guest's `talon serve --longhorn-listen` (no
# SPDK) holds the engine-frontend. Every instance is made through Longhorn's gRPC protocol in the
# order longhorn-manager v1.12.1 relocates an engine: engine e-0 on A; the engine-frontend on it;
# engine e-1 on B over the same replicas; InstanceSwitchOverTarget preparing, switching, promoting
# (a phase that fails is asked again, as the manager does); e-0 deleted; then back to A the same
# way (e-2), with the guest's talon killed (SIGKILL) after preparing and after switching and
# started again (the frontend keeps its target and the record; the next phase goes on), e-1
# deleted. fio (libaio, direct, 4 KiB random writes, crc32c verify of what it
# wrote, while it writes) runs throughout: no I/O error, no verify failure; the longest I/O is
# reported. 2 MiB written before the first move read back after the last; /dev/longhorn/<volume>
# keeps its major:minor; the frontend reports the new target after each move; its delete leaves no
# controller. Skipped by the harness without SPDK on the host.
# vm-timeout: 480
set -u
VOL=lhs
SIZE=67108864
A=$TALON_HOST_LHS_A
B=$TALON_HOST_LHS_B
DIR=$TALON_HOST_LHS_DIR
D=/tmp/lhs-guest
fail=0
say() { echo "longhorn-switch: $*"; }
ctrls() { for c in /sys/class/nvme/nvme*; do [ "$(cat $c/transport 2>/dev/null)" = tcp ] && basename $c; done; }
# lh <node ip> <op> args..: one call of Longhorn's protocol; prints the answer's value
lh() {
	at=$1
	shift
	TALON_LH_ADDR=$at:8500 TALON_LH_CALL="$*" "$TALON_HOST_LH_CLIENT" --ignored --exact longhorn_client \
		--nocapture >$D/call.out 2>&1
	cat $D/call.out >>$D/client.log
	sed -n 's/^LH [a-z]*=//p' $D/call.out | tail -n1
}
now_ms() { awk '{printf "%d", $1 * 1000}' /proc/uptime; }
# the guest's talon killed (SIGKILL) and started again on its state; the kernel's paths stay
serve() {
	talon serve --data-dir $D/data --run-dir $D/run --socket $D/talon.sock --config $D/config.yaml \
		--longhorn-listen 127.0.0.1:8500 >>$D/serve.log 2>&1 &
	PID=$!
}
crash() {
	kill -9 $PID
	wait $PID 2>/dev/null
	say "talon of the frontend's node killed after $1; started again"
	serve
}
# the kernel's ANA state of its path to $1 (ip:port), as the guest's NVMe multipath sees it
ana_of() {
	for c in /sys/class/nvme/nvme*; do
		case "$(cat $c/address 2>/dev/null)" in
		*traddr=${1%:*},trsvcid=${1#*:}*)
			for p in $c/nvme*c*n*/ana_state; do
				[ -f $p ] && cat $p && return
			done
			;;
		esac
	done
	echo none
}
# the host's talon of node $1 (A or B, at $2) killed (SIGKILL) and started again by the host's
# watcher (longhorn-switch.host, on this line of the console); its spdk_tgt keeps serving. Waits
# until it was seen down and is up again, then until it had time to apply its state.
host_crash() {
	echo "@@ LHS KILL $1"
	t=$(now_ms)
	n=0
	until [ "$(lh $2 up)" = no ]; do
		n=$((n + 1))
		[ $n -lt 40 ] || { say "FAIL the talon of node $1 was not seen down"; return 1; }
	done
	n=0
	until [ "$(lh $2 up)" = yes ]; do
		n=$((n + 1))
		[ $n -lt 120 ] || { say "FAIL the talon of node $1 is not up again"; return 1; }
		sleep 0.5
	done
	sleep 5
	say "talon of node $1 killed after $3; up again $(($(now_ms) - t)) ms later (+5 s)"
}
# the kernel's ANA state of the path to $1 is $2 (within 6 s: the kernel reads the ANA log on the
# target's notice)
ana_is() {
	for _ in 1 2 3 4 5 6 7 8 9 10 11 12; do
		got=$(ana_of $1)
		[ "$got" = "$2" ] && return 0
		sleep 0.5
	done
	say "FAIL $3: the path to $1 is $got, not $2"
	return 1
}
# move the engine-frontend to engine $1 at $2: the three phases, each asked again until it
# passes. With $3 = crash, the guest's talon is killed after preparing and after switching; with
# $3 = hostcrash, the new engine's node's talon (node $4 at $5) after preparing and the old
# engine's (node $6 at $7, its engine at $8) after switching: the kernel's paths keep the ANA
# states the phases set (the restarted talon applies its engine's, never optimized anew).
move() {
	for phase in preparing switching promoting; do
		if [ "${3:-}" = crash ] && [ $phase != preparing ]; then
			crash "$last"
			lh 127.0.0.1 get engine-frontend $VOL-ef-0 >/dev/null
			grep -q "^LH engine=$OLD " $D/call.out || { say "FAIL after the restart: $(grep '^LH' $D/call.out)"; return 1; }
		fi
		if [ "${3:-}" = hostcrash ] && [ $phase = switching ]; then
			host_crash $4 $5 $last || return 1
			ana_is $2 non-optimized "node $4 restarted after preparing" || return 1
			ana_is $8 optimized "node $4 restarted after preparing" || return 1
		fi
		if [ "${3:-}" = hostcrash ] && [ $phase = promoting ]; then
			host_crash $6 $7 $last || return 1
			ana_is $8 inaccessible "node $6 restarted after switching" || return 1
			ana_is $2 non-optimized "node $6 restarted after switching" || return 1
		fi
		last=$phase
		t0=$(now_ms)
		tries=0
		until [ "$(lh 127.0.0.1 switchover $VOL-ef-0 $2 $1 $phase)" = $phase ]; do
			tries=$((tries + 1))
			say "$phase to $1 at $2 failed ($tries): $(grep '^LH failed' $D/call.out)"
			[ $tries -lt 10 ] || return 1
			sleep 2
		done
		say "$phase to $1: $(($(now_ms) - t0)) ms"
	done
	G=$(lh 127.0.0.1 get engine-frontend $VOL-ef-0)
	say "frontend after the move: $(grep '^LH engine' $D/call.out)"
	grep -q "^LH engine=$1 active=$2 " $D/call.out || { say "FAIL the frontend does not report $1 at $2"; return 1; }
	ana_is $2 optimized "after the move" || return 1
}
fatal() {
	say "FAIL $*"
	tail -20 $D/client.log
	tail -40 $D/serve.log
	[ -n "${FIO:-}" ] && kill -INT $FIO 2>/dev/null
	kill $PID 2>/dev/null
	exit 1
}
mkdir -p $D/data/nvme
echo "$TALON_HOST_LHS_GUEST_ID" >$D/data/nvme/hostid
echo "nqn.2014-08.org.nvmexpress:uuid:$TALON_HOST_LHS_GUEST_ID" >$D/data/nvme/hostnqn
cat >$D/config.yaml <<CFG
node:
  hugepages: "off"
CFG
[ "$(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)" = Y ] || say "nvme_core multipath is $(cat /sys/module/nvme_core/parameters/multipath 2>/dev/null)"
serve

[ "$(lh $A disk lhs-a $DIR/A/disk.img)" = lhs-a ] || fatal "DiskCreate on node A"
[ "$(lh $B disk lhs-b $DIR/B/disk.img)" = lhs-b ] || fatal "DiskCreate on node B"
PA=$(lh $A replica $VOL-r-0000000a $VOL lhs-a $SIZE)
PB=$(lh $B replica $VOL-r-0000000b $VOL lhs-b $SIZE)
[ -n "$PA" ] && [ -n "$PB" ] || fatal "replicas: A port ${PA:-none}, B port ${PB:-none}"
MAP=$VOL-r-0000000a=$A:$PA,$VOL-r-0000000b=$B:$PB
E0=$(lh $A engine $VOL-e-0 $VOL $SIZE $MAP)
[ -n "$E0" ] || fatal "engine e-0 on node A"
EP=$(lh 127.0.0.1 frontend $VOL-ef-0 $VOL $VOL-e-0 $A:$E0 $SIZE)
[ "$EP" = /dev/longhorn/$VOL ] && [ -b "$EP" ] || fatal "no block device at /dev/longhorn/$VOL"
DEV0=$(stat -L -c %t:%T $EP)
dd if=/dev/urandom of=/tmp/p bs=1M count=2 2>/dev/null
dd if=/tmp/p of=$EP bs=1M seek=32 count=2 oflag=direct 2>/dev/null || fatal "writing the pattern"
P0=$(md5sum </tmp/p | cut -c1-32)

fio --name=switch --filename=$EP --rw=randwrite --bs=4k --iodepth=4 --ioengine=libaio --direct=1 \
	--size=16M --verify=crc32c --verify_backlog=64 --time_based --runtime=1800 \
	--output-format=json --output=$D/fio.json >$D/fio.out 2>&1 &
FIO=$!
sleep 3
kill -0 $FIO 2>/dev/null || fatal "fio did not start: $(cat $D/fio.out)"

T0=$(now_ms)
E1=$(lh $B engine $VOL-e-1 $VOL $SIZE $MAP)
[ -n "$E1" ] || fatal "engine e-1 on node B"
say "engine e-1 on node B running: $(($(now_ms) - T0)) ms"
OLD=$VOL-e-0
move $VOL-e-1 $B:$E1 || fatal "the move to node B"
[ "$(lh $A delete engine $VOL-e-0 cleanup)" = $VOL-e-0 ] || fatal "deleting e-0"
say "moved to node B: $(($(now_ms) - T0)) ms; paths: $(ctrls | tr '\n' ' ')"
sleep 3

T1=$(now_ms)
E2=$(lh $A engine $VOL-e-2 $VOL $SIZE $MAP)
[ -n "$E2" ] || fatal "engine e-2 on node A"
OLD=$VOL-e-1
move $VOL-e-2 $A:$E2 crash || fatal "the move back to node A"
[ "$(lh $B delete engine $VOL-e-1 cleanup)" = $VOL-e-1 ] || fatal "deleting e-1"
say "moved back to node A: $(($(now_ms) - T1)) ms; paths: $(ctrls | tr '\n' ' ')"
sleep 3

T2=$(now_ms)
E3=$(lh $B engine $VOL-e-3 $VOL $SIZE $MAP)
[ -n "$E3" ] || fatal "engine e-3 on node B"
OLD=$VOL-e-2
move $VOL-e-3 $B:$E3 hostcrash B $B A $A $A:$E2 || fatal "the move to node B with the engine nodes' talons killed"
[ "$(lh $A delete engine $VOL-e-2 cleanup)" = $VOL-e-2 ] || fatal "deleting e-2"
say "moved to node B again: $(($(now_ms) - T2)) ms; paths: $(ctrls | tr '\n' ' ')"
sleep 3

# interrupted, fio exits non-zero; the job's error and its verify messages say how it went
kill -INT $FIO
wait $FIO
rc=$?
FIO=
J=$(tr -d ' \n' <$D/fio.json)
ERR=$(echo "$J" | sed -n 's/.*"error":\([0-9]*\),.*/\1/p')
W=$(echo "$J" | sed -n 's/.*"write":{"io_bytes":\([0-9]*\),.*/\1/p')
# the verify reads of what was written (verify_backlog)
RB=$(echo "$J" | sed -n 's/.*"read":{"io_bytes":\([0-9]*\),.*/\1/p')
IOPS=$(echo "$J" | sed -n 's/.*"write":{[^}]*"iops":\([0-9.]*\),.*/\1/p')
MAX=$(awk '/"write" : \{/ {w = 1} w && /^ *"lat_ns" : \{/ {l = 1} w && l && /"max"/ {gsub(/[^0-9]/, ""); print; exit}' $D/fio.json)
grep -i "verify\|error" $D/fio.out | head -5
say "fio rc=$rc error=${ERR:-?} write_bytes=${W:-?} verify_read_bytes=${RB:-?} iops=${IOPS:-?} longest I/O ${MAX:-?} ns"
[ "$ERR" = 0 ] && [ -n "$W" ] && [ "$W" -gt 0 ] && [ -n "$RB" ] && [ "$RB" -gt 0 ] || { say "FAIL fio: $(tail -5 $D/fio.out)"; fail=1; }
grep -qi "verify.*fail\|bad magic\|crc32c" $D/fio.out && { say "FAIL fio verify: $(grep -i verify $D/fio.out | head -3)"; fail=1; }

P1=$(dd if=$EP bs=1M skip=32 count=2 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
DEV1=$(stat -L -c %t:%T $EP)
[ "$P0" = "$P1" ] || { say "FAIL the pattern written before the moves reads back $P1, not $P0"; fail=1; }
[ "$DEV0" = "$DEV1" ] || { say "FAIL /dev/longhorn/$VOL was $DEV0, is $DEV1"; fail=1; }
[ "$(lh 127.0.0.1 delete engine-frontend $VOL-ef-0)" = $VOL-ef-0 ] || { say "FAIL delete of the engine-frontend"; fail=1; }
[ -z "$(ctrls)" ] || { say "FAIL controllers left after the delete: $(ctrls)"; fail=1; }
[ $fail = 0 ] && R=ok || R=failed
echo "LHS_RESULT $R moves=3 fio_error=${ERR:-?} verified_bytes=${RB:-?} longest_io_ns=${MAX:-?} iops=${IOPS:-?} pattern=$P1"
kill $PID 2>/dev/null
wait $PID 2>/dev/null
[ $fail = 0 ] || tail -30 $D/serve.log
exit $fail
