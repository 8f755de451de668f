#!/bin/sh
# Guest step pci-daemon: `talon serve` binds a Disk's NVMe device itself (the
# emulated NVMe, serial talon-test-1, vIOMMU on) and gives it back when the
# Disk is removed. Checks: a Disk naming the serial -> bound by the daemon,
# driver_override cleared; Disk removed -> back on nvme with its namespace;
# talon killed (SIGKILL) at each step of a bind and of a give back (intent
# recorded, driver_override written, unbound, probed: 8 runs), and at random
# points (TALON_VM_PCI_KILL_RUNS rounds of a bind and a give back, default 2,
# 6 for 20 runs in all; 0-200 ms after the rebind is seen to start): after a restart the device is fully bound / back on nvme, never
# in between; an NVMe with a mounted file system is refused and left alone.
# The guest has no SPDK: the daemon runs with V2 unavailable, which does not
# stop the binding (SPDK's disk controller holds nothing here). Exit 0 = pass.
# vm-timeout: 600
set -u
SERIAL=talon-test-1
fail=0
say() { echo "pci-daemon: $*"; }
ok() { say "ok   $*"; }
bad() { say "FAIL $*"; fail=1; }

BDF=""
for s in /sys/bus/pci/devices/*/nvme/nvme*/serial; do
	[ -r "$s" ] || continue
	[ "$(tr -d ' ' <"$s")" = "$SERIAL" ] && BDF=$(echo "$s" | cut -d/ -f6)
done
[ -n "$BDF" ] || { say "FAIL no NVMe with serial $SERIAL on nvme"; exit 1; }
say "device $BDF"
drv() { basename "$(readlink /sys/bus/pci/devices/$BDF/driver 2>/dev/null)" 2>/dev/null; }
override() { cat /sys/bus/pci/devices/$BDF/driver_override; }
ns() { ls /sys/bus/pci/devices/$BDF/nvme/nvme*/ /sys/class/nvme-subsystem/*/ 2>/dev/null | grep -E '^nvme[0-9]+n[0-9]+$' | head -n1; }
settled() { # the device on nvme or on a user-space driver, driver_override cleared
	case "$(drv)" in nvme | vfio-pci | uio_pci_generic) [ "$(override)" = "(null)" ] ;; *) false ;; esac
}

D=/tmp/pci-daemon
rm -rf $D && mkdir -p $D
export TALON_SOCKET=$D/talon.sock
cat >$D/config.yaml <<EOF
node:
  hugepages: "off"
disks:
  nvme0: { pci: $SERIAL }
EOF
PID=""
start() {
	talon serve --data-dir $D/data --run-dir $D/run --socket $TALON_SOCKET --config "${1:-$D/config.yaml}" >>$D/talon.log 2>&1 &
	PID=$!
}
stop9() { kill -9 "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=""; }
stop() { kill "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; PID=""; }
binding() { talon get pcibindingstatus nvme0 -o json 2>/dev/null; }
wait_for() { # wait_for <seconds> <command...>: by the clock (a talon call takes a while under TCG)
	end=$(($(date +%s) + $1)); shift
	while [ "$(date +%s)" -le $end ]; do "$@" && return 0; sleep 0.1; done
	return 1
}
is_bound() { settled && [ "$(drv)" != nvme ] && binding | grep -q '"state": *"bound"'; }
is_back() { [ "$(drv)" = nvme ] && [ "$(override)" = "(null)" ] && ! talon get disk nvme0 >/dev/null 2>&1; }
rand_ms() { awk -v s="$1" 'BEGIN { srand(s); printf "0.%03d", int(rand() * 200) }'; }
moving_from() { [ "$(override)" != "(null)" ] || [ "$(drv)" != "$1" ]; } # a rebind away from $1 started

# a blank device to start from
[ "$(drv)" = nvme ] || talon host pci unbind $BDF >/dev/null 2>&1
wait_for 10 sh -c '[ -n "$(ls /sys/bus/pci/devices/'$BDF'/nvme/nvme*/ 2>/dev/null | grep -E "^nvme[0-9]+n[0-9]+$")" ]'
NS=$(ns)
[ -n "$NS" ] || { bad "no namespace block device"; exit 1; }
dd if=/dev/zero of=/dev/$NS bs=1M count=1 2>/dev/null && sync

# 1. a mounted file system: refused, left alone
mkdir -p /mnt/pci-daemon
modprobe ext4 2>/dev/null || modprobe ext2 2>/dev/null || true
if mke2fs -q /dev/$NS >/dev/null 2>&1 && mount -t ext2 /dev/$NS /mnt/pci-daemon; then
	start
	if wait_for 60 sh -c 'talon get pcibindingstatus nvme0 -o json 2>/dev/null | grep -q "mounted at /mnt/pci-daemon"'; then
		ok "daemon refuses the mounted disk: $(binding | grep '"message"' | head -n1)"
	else
		bad "no refusal in PciBindingStatus"; binding; tail -20 $D/talon.log
	fi
	talon get diskstatus nvme0 -o json 2>/dev/null | grep -q "not bound" && ok "DiskStatus says why" || say "note: DiskStatus $(talon get diskstatus nvme0 -o json 2>/dev/null | grep message)"
	[ "$(drv)" = nvme ] && ok "still on nvme" || bad "moved to $(drv) while mounted"
	stop
	umount /mnt/pci-daemon
else
	bad "cannot make and mount ext2 on /dev/$NS"
fi
dd if=/dev/zero of=/dev/$NS bs=1M count=1 2>/dev/null && sync

# 2. bound by the daemon, then given back when the Disk is removed
start
if wait_for 60 is_bound; then ok "bound by the daemon to $(drv), driver_override cleared"; else bad "not bound: driver $(drv), $(binding)"; tail -20 $D/talon.log; fi
talon get pcibindintent -o json 2>/dev/null | grep -q '"originalDriver": *"nvme"' && ok "intent recorded (original nvme)" || bad "no intent in the ledger"
talon disk remove nvme0 >/dev/null 2>&1 || talon rpc disk_remove '{"name": "nvme0"}' >/dev/null 2>&1
if wait_for 60 is_back; then ok "Disk removed: back on nvme"; else bad "not given back: driver $(drv) override $(override)"; tail -20 $D/talon.log; fi
wait_for 10 sh -c '[ -n "$(ls /sys/bus/pci/devices/'$BDF'/nvme/nvme*/ 2>/dev/null | grep -E "^nvme[0-9]+n[0-9]+$")" ]' && ok "namespace back" || bad "namespace did not come back"
stop

# 3. killed at each step of a rebind (TALON_FAILPOINT: talon SIGKILLs itself
# right after that step), for a bind and for a give back; a restart finishes it
printf 'node:\n  hugepages: "off"\n' >$D/empty.yaml
died() { ! kill -0 "$PID" 2>/dev/null; }
cut_at() { # the daemon ($PID) kills itself at the failpoint; bounded wait
	if wait_for 60 died; then wait "$PID" 2>/dev/null; else bad "$1: talon did not stop at the failpoint"; stop9; fi
	PID=""
}
for fp in pci-after-intent pci-after-override pci-after-unbind pci-after-probe; do
	TALON_FAILPOINT=$fp start
	cut_at $fp
	seen="$(drv)/$(override)"
	start
	if wait_for 60 is_bound; then ok "bind cut at $fp (left $seen): bound after restart"; else bad "bind cut at $fp (left $seen): after restart driver $(drv) override $(override)"; tail -5 $D/talon.log; fi
	stop
	TALON_FAILPOINT=$fp start
	wait_for 60 is_bound || bad "$fp: not bound before the give back"
	talon disk remove nvme0 >/dev/null 2>&1 || talon rpc disk_remove '{"name": "nvme0"}' >/dev/null 2>&1
	cut_at $fp
	seen="$(drv)/$(override)"
	start $D/empty.yaml
	if wait_for 60 is_back; then ok "give back cut at $fp (left $seen): on nvme after restart"; else bad "give back cut at $fp (left $seen): after restart driver $(drv) override $(override)"; tail -5 $D/talon.log; fi
	stop
	wait_for 10 sh -c '[ -n "$(ls /sys/bus/pci/devices/'$BDF'/nvme/nvme*/ 2>/dev/null | grep -E "^nvme[0-9]+n[0-9]+$")" ]' || bad "$fp: namespace did not come back"
done

# 4. kill -9 at random points of binds and give backs (TALON_HOST_PCI_KILL_RUNS rounds)
ROUNDS=${TALON_HOST_PCI_KILL_RUNS:-2}
mid=0
i=1
while [ $i -le "$ROUNDS" ]; do
	# bind: the Disk in the config; killed after a random delay
	start
	wait_for 60 moving_from nvme
	sleep "$(rand_ms $i)"
	stop9
	settled || mid=$((mid + 1))
	seen="$(drv)/$(override)"
	start
	if wait_for 60 is_bound; then ok "bind run $i: killed at $seen, bound after restart"; else bad "bind run $i: killed at $seen, after restart driver $(drv) override $(override)"; tail -5 $D/talon.log; fi
	# give back: removed, killed after a random delay, restarted without the Disk
	from=$(drv)
	talon disk remove nvme0 >/dev/null 2>&1 || talon rpc disk_remove '{"name": "nvme0"}' >/dev/null 2>&1
	wait_for 60 moving_from "$from"
	sleep "$(rand_ms $((i + 100)))"
	stop9
	settled || mid=$((mid + 1))
	seen="$(drv)/$(override)"
	start $D/empty.yaml
	if wait_for 60 is_back; then ok "give back run $i: killed at $seen, on nvme after restart"; else bad "give back run $i: killed at $seen, after restart driver $(drv) override $(override)"; tail -5 $D/talon.log; fi
	stop
	wait_for 10 sh -c '[ -n "$(ls /sys/bus/pci/devices/'$BDF'/nvme/nvme*/ 2>/dev/null | grep -E "^nvme[0-9]+n[0-9]+$")" ]' || bad "run $i: namespace did not come back"
	i=$((i + 1))
done
say "random kills that landed between drivers: $mid of $((ROUNDS * 2))"

[ -n "$PID" ] && stop
[ "$(drv)" = nvme ] || talon host pci unbind $BDF >/dev/null 2>&1
[ $fail -eq 0 ] && say "PASS" || say "FAILED"
exit $fail
