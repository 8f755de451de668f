#!/bin/sh
# Guest step host-doctor: `talon host hugepages --set` on a real kernel (set,
# verify, mount hugetlbfs, map one page, restore) and `talon doctor` reading the
# guest's real modules, IOMMU and NVMe device. Exit 0 = pass.
set -u
fail=0
say() { echo "host-doctor: $*"; }
ok() { say "ok   $*"; }
bad() { say "FAIL $*"; fail=1; }
nr=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
orig=$(cat $nr)

out=$(talon host hugepages --set 16 --size 2M 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] && [ "$(cat $nr)" = 16 ] && ok "16 pages set" || bad "set 16 pages (rc $rc, now $(cat $nr))"
echo "$out" | grep -q "mapped one 2M page: usable" && ok "one page mapped" || bad "no page mapped"
grep -q " hugetlbfs " /proc/mounts && ok "hugetlbfs mounted" || bad "hugetlbfs not mounted"
talon host hugepages | grep -q "^2M .* 16 " && ok "listed" || bad "pool not listed with 16 pages"

out=$(talon doctor --volumes 0 2>&1)
echo "$out"
echo "$out" | grep -q "PASS  hugepages-2M" && bad "512 MiB cannot pass with 32 MiB" || ok "hugepages short of 512 MiB flagged"
echo "$out" | grep -q "PASS  iommu" && ok "IOMMU seen" || bad "IOMMU not seen"
echo "$out" | grep -q "talon-test-1" && ok "NVMe listed" || bad "NVMe not listed"
# no spdk_tgt and no tgtd in the guest: the verdict says so, with the reasons
echo "$out" | grep -E "^(PASS|WARN|FAIL)  engine " | grep -q "spdk_tgt was not found" && ok "engine verdict with its reason" || bad "no engine verdict"
echo "$out" | grep -Eq "(PASS|WARN)  module nvme_tcp" && ok "nvme_tcp loaded or loadable" || bad "nvme_tcp state"
talon doctor --for talos --talos-version 1.15 --hugepages-mib 32 --disk talon-test-1 -o yaml > /tmp/d.yaml 2>&1
grep -q "kind: PCIDriverRebindConfig" /tmp/d.yaml && grep -q "targetDriver: vfio-pci" /tmp/d.yaml &&
	ok "Talos v1.15 patch with vfio-pci rebind" || { cat /tmp/d.yaml; bad "Talos patch"; }

talon host hugepages --set "$orig" >/dev/null && [ "$(cat $nr)" = "$orig" ] && ok "restored $orig" || bad "restore"
[ $fail -eq 0 ] && say "PASS" || say "FAILED"
exit $fail
