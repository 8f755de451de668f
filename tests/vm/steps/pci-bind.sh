#!/bin/sh
# Guest step pci-bind: real NVMe driver binding with `talon host pci` in the QEMU
# guest (one emulated NVMe, serial talon-test-1, 256 MiB, on nvme at start,
# vIOMMU on). Checks: inventory; refusal while the disk carries a mounted file
# system and while it carries an ext2 signature; nvme -> uio_pci_generic ->
# vfio-pci -> nvme; driver_override cleared after each move; bad input leaves
# the device alone. Exit 0 = pass.
set -u
SERIAL=talon-test-1
fail=0
say() { echo "pci-bind: $*"; }
ok() { say "ok   $*"; }
bad() { say "FAIL $*"; fail=1; }

BDF=""
for s in /sys/bus/pci/devices/*/nvme/nvme*/serial; do
	[ -r "$s" ] || continue
	if [ "$(cat "$s" | tr -d ' ')" = "$SERIAL" ]; then
		BDF=$(echo "$s" | cut -d/ -f6)
	fi
done
[ -n "$BDF" ] || { say "FAIL no NVMe with serial $SERIAL on nvme"; exit 1; }
say "device $BDF"
drv() { basename "$(readlink /sys/bus/pci/devices/$BDF/driver 2>/dev/null)" 2>/dev/null; }
override() { cat /sys/bus/pci/devices/$BDF/driver_override; }
ns() { ls /sys/bus/pci/devices/$BDF/nvme/nvme*/ /sys/class/nvme-subsystem/*/ 2>/dev/null | grep -E '^nvme[0-9]+n[0-9]+$' | head -n1; }
expect_driver() {
	if [ "$(drv)" = "$1" ] && [ "$(override)" = "(null)" ]; then ok "$BDF on $1, driver_override cleared"; else bad "$BDF on $(drv) override $(override), want $1"; fi
}

out=$(talon host pci list 2>&1); echo "$out"
echo "$out" | grep -q "$BDF" && echo "$out" | grep -q "$SERIAL" && ok "pci list shows $BDF $SERIAL" || bad "pci list"

NS=$(ns)
[ -n "$NS" ] && ok "namespace /dev/$NS" || { bad "no namespace block device"; exit 1; }

# Refusal 1: a mounted file system.
mkdir -p /mnt/pci-bind
modprobe ext4 2>/dev/null || modprobe ext2 2>/dev/null || true # the guest needs ext4 (mounts ext2) for this check
if mke2fs -q /dev/$NS >/dev/null 2>&1 && mount -t ext2 /dev/$NS /mnt/pci-bind; then
	out=$(talon host pci bind $SERIAL --driver uio_pci_generic 2>&1); rc=$?
	echo "$out"
	[ $rc -ne 0 ] && echo "$out" | grep -q "mounted at /mnt/pci-bind" && ok "bind refused: mounted" || bad "bind of a mounted disk not refused"
	[ "$(drv)" = nvme ] && ok "still on nvme" || bad "driver moved to $(drv) after refusal"
	umount /mnt/pci-bind
else
	bad "cannot make and mount ext2 on /dev/$NS"
fi

# Refusal 2: unmounted, but an ext2 signature.
out=$(talon host pci bind $BDF --driver uio_pci_generic 2>&1); rc=$?
echo "$out"
[ $rc -ne 0 ] && echo "$out" | grep -q "ext2/3/4" && ok "bind refused: signature" || bad "bind of a formatted disk not refused"
[ "$(drv)" = nvme ] || bad "driver moved to $(drv) after refusal"
dd if=/dev/zero of=/dev/$NS bs=1M count=1 2>/dev/null && sync

# Bad input: nothing changes.
talon host pci bind 0000:00:1f.9 >/dev/null 2>&1 && bad "malformed BDF accepted" || ok "malformed BDF refused"
talon host pci bind 0000:7f:00.0 >/dev/null 2>&1 && bad "unknown BDF accepted" || ok "unknown BDF refused"
talon host pci bind /dev/$NS >/dev/null 2>&1 && bad "/dev name accepted" || ok "/dev name refused"
[ "$(drv)" = nvme ] || bad "bad input moved the driver to $(drv)"

# nvme -> uio_pci_generic (by serial) -> vfio-pci -> nvme.
talon host pci bind $SERIAL --driver uio_pci_generic || bad "bind uio_pci_generic"
expect_driver uio_pci_generic
talon host pci bind $BDF --driver vfio-pci || bad "bind vfio-pci"
expect_driver vfio-pci
ls /dev/vfio/ | grep -q '^[0-9]' && ok "vfio group node $(ls /dev/vfio | grep '^[0-9]')" || bad "no /dev/vfio/<group>"
# A process holding the vfio group open: unbind must refuse (the kernel would block).
G=$(basename "$(readlink /sys/bus/pci/devices/$BDF/iommu_group)")
if exec 3<>/dev/vfio/$G; then
	out=$(talon host pci unbind $BDF 2>&1); rc=$?
	echo "$out"
	[ $rc -ne 0 ] && echo "$out" | grep -q "opened through vfio-pci by sh" && ok "unbind refused while /dev/vfio/$G is open" || bad "unbind of an opened vfio device not refused"
	exec 3>&-
	expect_driver vfio-pci
else
	bad "cannot open /dev/vfio/$G"
fi
talon host pci unbind $BDF || bad "unbind"
expect_driver nvme
i=0
while [ -z "$(ns)" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -n "$(ns)" ] && ok "namespace back: /dev/$(ns)" || bad "namespace did not come back"
talon host pci list | grep -q "$SERIAL" && ok "serial visible again" || bad "serial not listed after unbind"

[ $fail -eq 0 ] && say "PASS" || say "FAILED"
exit $fail
