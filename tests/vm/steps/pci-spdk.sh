#!/bin/sh
# Guest step pci-spdk (needs TALON_SPDK_DIR on the host; opt-in, TALON_VM_PCI_SPDK=1): `talon serve`
# with spdk_tgt inside the guest, `hugepages: 1024` and a Disk naming the emulated NVMe by PCI address.
# The device carries an XFS signature and is put on vfio-pci by hand (as a Talos machine config
# does): talon reads its ends through SPDK (NVMe Reads) and refuses it, naming the device, the XFS
# and `talon disk format nvme0 --yes-destroy-data`; that command makes the lvstore; a 16 MiB volume
# on it takes a write and a read over NVMe/TCP. Then talon and spdk_tgt stop, the device goes back
# to nvme, a byte of the lvstore's superblock is flipped and talon starts again: the lvstore does
# not load, the disk is refused with the UUID talon recorded, and its first MiB is unchanged.
# Then the Disk is removed: the device is back on nvme. Exit 0 = pass.
# vm-timeout: 600
set -u
SERIAL=talon-test-1
SPDK=${TALON_HOST_SPDK_TGT:-}
fail=0
say() { echo "pci-spdk: $*"; }
ok() { say "ok   $*"; }
bad() { say "FAIL $*"; fail=1; }
[ -x "$SPDK" ] || { say "FAIL spdk_tgt ($SPDK) is not in the guest"; exit 1; }

BDF=""
for s in /sys/bus/pci/devices/*/nvme/nvme*/serial; do
	[ -r "$s" ] || continue
	[ "$(tr -d ' ' <"$s")" = "$SERIAL" ] && BDF=$(echo "$s" | cut -d/ -f6)
done
[ -n "$BDF" ] || { say "FAIL no NVMe with serial $SERIAL on nvme"; exit 1; }
drv() { basename "$(readlink /sys/bus/pci/devices/$BDF/driver 2>/dev/null)" 2>/dev/null; }
NS=$(ls /sys/bus/pci/devices/$BDF/nvme/nvme*/ 2>/dev/null | grep -E '^nvme[0-9]+n[0-9]+$' | head -n1)
# an XFS signature on it, then the device put on vfio-pci by hand (as a Talos machine config
# does): talon uses it as it is, reads it through SPDK (NVMe Reads) and refuses it
[ -n "$NS" ] && dd if=/dev/zero of=/dev/$NS bs=1M count=1 2>/dev/null && printf XFSB | dd of=/dev/$NS conv=notrunc 2>/dev/null && sync
echo vfio-pci >/sys/bus/pci/devices/$BDF/driver_override
echo $BDF >/sys/bus/pci/devices/$BDF/driver/unbind
echo $BDF >/sys/bus/pci/drivers_probe
[ "$(drv)" = vfio-pci ] || say "FAIL the device is on $(drv), not vfio-pci"
wait_for() { # wait_for <seconds> <command...>: by the clock (a talon call takes a while under TCG)
	end=$(($(date +%s) + $1)); shift
	while [ "$(date +%s)" -le $end ]; do "$@" && return 0; sleep 0.1; done
	return 1
}
field() { sed -n "s/.*\"$1\": *\"*\([^\",]*\)\"*,*$/\1/p" | head -n1; }

# spdk_tgt initializes OpenSSL, which wants its config file (the initramfs has none)
[ -e /usr/lib/ssl/openssl.cnf ] || { mkdir -p /usr/lib/ssl && : >/usr/lib/ssl/openssl.cnf; }
# and its core locks in /var/tmp
mkdir -p /var/tmp

D=/tmp/pci-spdk
rm -rf $D && mkdir -p $D
export TALON_SOCKET=$D/talon.sock
cat >$D/config.yaml <<CFG
node: { hugepages: 1024, engine: v2 }
disks: { nvme0: { pci: $BDF } }
CFG
serve() {
	talon serve --data-dir $D/data --run-dir $D/run --socket $TALON_SOCKET --config $D/config.yaml \
		--spdk-tgt "$SPDK" --spdk-cpumask 0x1 >>$D/talon.log 2>&1 &
	PID=$!
}
stop_talon() { # talon, and the spdk_tgt it leaves running for the next talon to adopt
	kill "$PID" 2>/dev/null
	wait_for 60 sh -c "! kill -0 $PID 2>/dev/null" || { bad "talon did not stop"; kill -9 "$PID"; }
	T=$(pgrep -f 'bin/[s]pdk_tgt')
	[ -n "$T" ] && kill $T
	wait_for 60 sh -c "! pgrep -f 'bin/[s]pdk_tgt' >/dev/null" || { bad "spdk_tgt did not stop"; kill -9 $T; }
}
serve

hp_ok() { [ "$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)" -ge 512 ] && talon get hugepagesstatus -o json 2>/dev/null | grep -q '"state": *"ok"'; }
if wait_for 60 hp_ok; then
	ok "hugepages reserved by talon: $(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages) pages, $(grep -c hugetlbfs /proc/mounts) hugetlbfs mount(s)"
else
	bad "hugepages not reserved"; talon get hugepagesstatus -o yaml
fi
msg() { talon get diskstatus nvme0 -o json 2>/dev/null | sed -n 's/.*"message": *"\(.*\)",*$/\1/p' | head -n1; }
refused_for() { # refused_for <text>: the Disk failed with a message that names <text>
	talon get diskstatus nvme0 -o json 2>/dev/null | grep -q '"state": *"failed"' && msg | grep -qF "$1"
}
if wait_for 240 refused_for "an XFS file system"; then
	M=$(msg)
	echo "$M" | grep -qF "NVMe $BDF (bdev talon-disk-nvme0n1)" && echo "$M" | grep -qF 'talon disk format nvme0 --yes-destroy-data' &&
		ok "an XFS signature read through SPDK and refused: $M" ||
		bad "refusal does not name the format command: $M"
else
	bad "the XFS on the NVMe was not refused: $(msg)"
fi
if talon disk format nvme0 --yes-destroy-data >/dev/null 2>&1; then
	ok "formatted on request (talon disk format --yes-destroy-data)"
else
	bad "talon disk format: $(msg)"
fi
LAST=""
disk_ready() { # prints each new state of the target and the disk on the way
	T=$(talon get targetstatus spdk -o json 2>/dev/null)
	J=$(talon get diskstatus nvme0 -o json 2>/dev/null)
	NOW="target $(echo "$T" | field state): $(echo "$T" | field message) | disk $(echo "$J" | field state): $(echo "$J" | field message)"
	[ "$NOW" != "$LAST" ] && say "...  $NOW" && LAST=$NOW
	echo "$J" | grep -q '"state": *"ready"'
}
if wait_for 240 disk_ready; then
	J=$(talon get diskstatus nvme0 -o json)
	ok "SPDK NVMe bdev $(echo "$J" | field bdev) with lvstore $(echo "$J" | field lvstore), $(echo "$J" | field totalBytes) bytes, device on $(drv)"
else
	bad "Disk not ready: $(talon get diskstatus nvme0 -o json 2>/dev/null | field message)"
	talon get pcibindingstatus nvme0 -o yaml; talon get targetstatus spdk -o yaml; tail -30 $D/talon.log
fi
case "$(drv)" in vfio-pci | uio_pci_generic) ok "device on $(drv)" ;; *) bad "device on $(drv)" ;; esac

# I/O through SPDK's bdev on the device: a volume attached with the kernel initiator
if talon rpc volume_create '{"name": "v1", "size": "16MiB", "replicas": 1, "wait": true}' >/dev/null 2>&1 &&
	talon rpc volume_attach '{"name": "v1", "wait": true}' >/dev/null 2>&1 && [ -b /dev/talon/v1 ]; then
	dd if=/dev/urandom of=/tmp/p bs=1M count=2 2>/dev/null
	A=$(md5sum </tmp/p | cut -c1-32)
	dd if=/tmp/p of=/dev/talon/v1 bs=1M seek=1 count=2 oflag=direct 2>/dev/null || bad "write"
	B=$(dd if=/dev/talon/v1 bs=1M skip=1 count=2 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
	[ "$A" = "$B" ] && ok "2 MiB written and read back through /dev/talon/v1 (SPDK on the NVMe), md5 $A" || bad "read back $B, wrote $A"
	talon rpc volume_detach '{"name": "v1", "wait": true}' >/dev/null 2>&1 || bad "detach"
	talon rpc volume_delete '{"name": "v1", "wait": true}' >/dev/null 2>&1 || bad "volume delete"
else
	bad "volume not created/attached: $(talon get enginestatus v1 -o json 2>/dev/null | field message)"
	tail -20 $D/talon.log
fi

# a damaged lvstore: talon stopped, the device back on nvme, one byte of the superblock flipped
# (the CRC no longer matches); talon started again: the lvstore does not load, the disk is refused
# with the UUID talon recorded, and nothing is written to the device
UUID=$(talon get diskstatus nvme0 -o json 2>/dev/null | field lvstoreUuid)
stop_talon
talon host pci unbind $BDF >/dev/null 2>&1 || bad "back to nvme for the damage: $(talon host pci unbind $BDF 2>&1)"
NS=""
wait_for 30 sh -c "ls /sys/bus/pci/devices/$BDF/nvme/nvme*/ 2>/dev/null | grep -qE '^nvme[0-9]+n[0-9]+$'"
NS=$(ls /sys/bus/pci/devices/$BDF/nvme/nvme*/ 2>/dev/null | grep -E '^nvme[0-9]+n[0-9]+$' | head -n1)
if [ -n "$NS" ] && [ "$(dd if=/dev/$NS bs=8 count=1 2>/dev/null)" = SPDKBLOB ]; then
	printf '\377' | dd of=/dev/$NS bs=1 seek=40 count=1 conv=notrunc 2>/dev/null && sync
	SUM=$(dd if=/dev/$NS bs=1M count=1 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
	serve
	if wait_for 240 refused_for "did not load"; then
		M=$(msg)
		echo "$M" | grep -qF "$UUID" && ok "damaged lvstore $UUID refused: $M" || bad "refusal lacks uuid $UUID: $M"
	else
		bad "the damaged lvstore was not refused: $(msg)"
	fi
	stop_talon
	talon host pci unbind $BDF >/dev/null 2>&1
	wait_for 30 sh -c "ls /sys/bus/pci/devices/$BDF/nvme/nvme*/ 2>/dev/null | grep -qE '^nvme[0-9]+n[0-9]+$'"
	NS=$(ls /sys/bus/pci/devices/$BDF/nvme/nvme*/ 2>/dev/null | grep -E '^nvme[0-9]+n[0-9]+$' | head -n1)
	AFTER=$(dd if=/dev/$NS bs=1M count=1 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
	[ "$SUM" = "$AFTER" ] && ok "nothing written over the damaged lvstore (first MiB md5 $SUM)" || bad "first MiB changed: $SUM -> $AFTER"
	serve
else
	bad "no lvstore superblock on the NVMe ($NS) after talon stopped"
	serve
fi

talon disk remove nvme0 >/dev/null 2>&1 || bad "disk remove refused"
back() { [ "$(drv)" = nvme ] && ! talon get disk nvme0 >/dev/null 2>&1; }
wait_for 120 back && ok "Disk removed: SPDK detached it, back on nvme" || { bad "not back on nvme: $(drv)"; talon get pcibindingstatus nvme0 -o yaml; }
kill "$PID" 2>/dev/null
wait_for 30 sh -c "! kill -0 $PID 2>/dev/null" || { bad "talon did not stop"; kill -9 "$PID"; }
pgrep spdk_tgt >/dev/null && { bad "spdk_tgt left running"; pkill -9 spdk_tgt; }
[ $fail -eq 0 ] && say "PASS" || { say "FAILED"; tail -40 $D/talon.log; }
exit $fail
