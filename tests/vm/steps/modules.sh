#!/bin/sh
# The guest is ready: talon runs (its shared libraries are all there) and the storage modules load.
# vm-timeout: 60
set -u
fail=0
talon --help >/dev/null 2>&1 || { echo "talon --help failed:"; talon --help; fail=1; }
echo "talon: $(ls -l /usr/bin/talon)"
if [ -s /run/init-modprobe.err ]; then cat /run/init-modprobe.err; fail=1; fi
for m in nvme nvme_fabrics nvme_tcp nvmet nvmet_tcp vfio_pci uio_pci_generic iscsi_tcp brd loop; do
	[ -d /sys/module/$m ] || { echo "module $m is not loaded"; fail=1; }
done
grep -q ' /sys/kernel/config configfs ' /proc/mounts || { echo "configfs not mounted"; fail=1; }
[ -c /dev/nvme-fabrics ] || { echo "/dev/nvme-fabrics missing"; fail=1; }
ip -4 addr show eth0 | grep -q '10.0.2.15' || { echo "eth0 has no 10.0.2.15"; fail=1; }
# the emulated PCI NVMe disk
found=0
for c in /sys/class/nvme/nvme*; do
	[ "$(cat $c/serial 2>/dev/null | tr -d ' ')" = "$TALON_NVME_SERIAL" ] && found=1 && echo "PCI NVMe $(basename $c): $(cat $c/model)"
done
[ $found = 1 ] || { echo "no NVMe controller with serial $TALON_NVME_SERIAL"; fail=1; }
echo "IOMMU groups: $(ls /sys/kernel/iommu_groups | wc -l)"
[ "$(ls /sys/kernel/iommu_groups | wc -l)" -gt 0 ] || { echo "no IOMMU groups"; fail=1; }
exit $fail
