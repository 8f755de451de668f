#!/usr/bin/env bash
# tests/vm/run.sh - talon's real-kernel guest tests.
#
# Boots Debian's 6.1 kernel under QEMU (TCG) with a busybox initramfs that carries the storage
# modules, the guest userland (iscsid/iscsiadm, fio, nvme-cli for cross-checks) and THE talon binary
# given as argument, plus an emulated NVMe PCI disk (serial talon-test-1, 256 MiB), an intel-iommu
# (intel_iommu=on iommu=pt) and user-mode networking (guest 10.0.2.2 = host 127.0.0.1). Runs the
# selected steps (tests/vm/steps/<name>.sh) in the guest and prints one line per step and
#   vm-tests: N passed, N failed
# Exit status: 0 when every step passed, 1 when one failed, 2 on a harness error, 77 when the
# harness cannot run here (prints "SKIP vm-tests: <reason>").
#
#   host                                         guest (QEMU TCG, PVH boot of vmlinux)
#   ----                                         -----
#   apt-get download -> $CACHE/debs              /init: mounts, modprobe, eth0 10.0.2.15
#   dpkg -x + depmod -> $CACHE/root-<key>        for each step: fresh tmpfs /tmp,
#   initramfs: busybox, kmod, modules,             timeout N sh /steps/<name>.sh
#     iscsid, fio, nvme, talon (+ ldd libs)        "@@ STEP <name> PASS|FAIL (Ts)"
#   <step>.host setup (tgtd, SPDK, ...)  <--TCP-- 10.0.2.2:<port> (host 127.0.0.1 only)
#   <step>.host check after the guest powered off
#
# Usage: tests/vm/run.sh [--steps a,b,c] [--keep] /path/to/talon
#
# Step contract (for everyone writing steps):
# - tests/vm/steps/<name>.sh: busybox sh script, run as root in the guest, `talon` on PATH, cwd a
#   fresh tmpfs /tmp, env TALON_HOST_ADDR=10.0.2.2, TALON_STEP=<name>, TALON_NVME_SERIAL=talon-test-1,
#   plus every TALON_HOST_* variable the host hooks exported (ports of host-side services).
#   Exit 0 = pass. Output goes to the log. A line "# vm-timeout: N" in the script sets its timeout
#   in seconds (default 120); the step is killed and fails after that.
# - Modules are loaded, configfs is mounted and eth0 is up before the first step.
# - Optional tests/vm/steps/<name>.host: bash script run on the HOST as `<name>.host setup` before
#   boot and `<name>.host check` after the guest powered off (cwd: the run's host dir). In setup it
#   may start services (listen on 127.0.0.1 only; pick ports with `free_port`, which it can call as
#   "$TALON_VM_FREE_PORT") and must print lines `export TALON_HOST_<X>=<value>` to pass values to
#   the guest and `pid <PID>` for each process the harness must stop at exit. The check phase sees
#   the guest log in $TALON_VM_GUEST_LOG; its exit status counts as step "<name>.host".
#   Host-side tgtd: `tgtd` of the host (package tgt, tests/apt-packages.txt). SPDK: the hooks look
#   at TALON_SPDK_DIR themselves; a setup that prints "skip <reason>" (and exits 0) skips the step:
#   it is not run, not counted, and reported as "step <name> SKIP: <reason>". A setup line
#   `file <absolute host path>` puts that program in the guest at the same path (debug info
#   stripped), with its shared libraries.
#   Helpers to source from hooks: $TALON_VM_HOST_LIB/tgtd.sh; $TALON_VM_TALON_BIN is the talon binary.
#   The guest's log is $TALON_VM_GUEST_LOG from setup on: a setup may start a watcher (printed as
#   `pid`) that waits for its step's "@@ STEP <name> PASS|FAIL" line there, saves what its check
#   reads and stops a service that would take host CPU from the guest for the rest of the run
#   (a polling spdk_tgt); mark such a step `# vm-order: early` so that it runs right after modules.
#
# Env knobs:
#   TALON_VM_CACHE=/var/cache/talon-vm   downloaded .debs and the extracted tree (reused across runs)
#   TALON_VM_TIMEOUT=N                   seconds before QEMU is killed (default: 180 for boot and
#                                        power-off plus the sum of the run steps' own vm-timeouts, so
#                                        the whole run never cuts a step that is within its own bound)
#   TALON_VM_SMP=2 TALON_VM_MEM=1536M (3072M with TALON_VM_PCI_SPDK=1) TALON_VM_ACCEL=tcg|kvm
#   TALON_VM_KEEP=1                      keep the run directory (always kept on failure)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
STEPS_DIR=$HERE/steps
CACHE=${TALON_VM_CACHE:-/var/cache/talon-vm}
TIMEOUT=${TALON_VM_TIMEOUT:-}
SMP=${TALON_VM_SMP:-2}
# spdk_tgt in the guest (pci-spdk, opt-in) needs 1 GiB of hugepages beside the initramfs: 3 GiB
if [ "${TALON_VM_PCI_SPDK:-0}" = 1 ]; then MEM=${TALON_VM_MEM:-3072M}; else MEM=${TALON_VM_MEM:-1536M}; fi
ACCEL=${TALON_VM_ACCEL:-tcg}
KEEP=${TALON_VM_KEEP:-0}
STEPS=""
TALON_BIN=""

usage() { echo "usage: $0 [--steps a,b,c] [--keep] /path/to/talon" >&2; exit 2; }
while [ $# -gt 0 ]; do
	case "$1" in
	--steps) STEPS=${2:?}; shift 2 ;;
	--steps=*) STEPS=${1#--steps=}; shift ;;
	--keep) KEEP=1; shift ;;
	-h | --help) usage ;;
	-*) echo "unknown option $1" >&2; usage ;;
	*) TALON_BIN=$1; shift ;;
	esac
done
[ -n "$TALON_BIN" ] || usage
[ -x "$TALON_BIN" ] || { echo "talon binary $TALON_BIN is not executable" >&2; exit 2; }
TALON_BIN=$(readlink -f "$TALON_BIN")

skip() { echo "SKIP vm-tests: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (apt-get download into $CACHE, dpkg -x, host-side targets)"
for t in apt-get apt-cache dpkg xz ldd ldconfig timeout flock; do
	command -v "$t" >/dev/null || skip "host tool $t is missing"
done

now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1f", b-a}'; }
T_ALL=$(now)

# ------------------------------------------------------------------ steps
if [ -z "$STEPS" ]; then
	# every step, modules first (it checks what all others rely on), then the steps marked
	# `# vm-order: early` (their host runs a polling spdk_tgt, which takes a host core from the
	# TCG guest until the step is over and its hook stops it), then by name (bytes: LC_ALL=C)
	STEPS=$(cd "$STEPS_DIR" && for f in *.sh; do
		n=${f%.sh}
		if [ "$n" = modules ]; then echo "0 $n"
		elif grep -q '^# vm-order: early' "$f"; then echo "1 $n"
		else echo "2 $n"; fi
	done | LC_ALL=C sort -k1,1n -k2,2 | cut -d' ' -f2 | paste -sd, -)
fi
IFS=, read -r -a STEP_LIST <<<"$STEPS"
for s in "${STEP_LIST[@]}"; do
	case "$s" in *[!a-z0-9_-]* | "") echo "bad step name '$s'" >&2; exit 2 ;; esac
	[ -f "$STEPS_DIR/$s.sh" ] || { echo "no step $STEPS_DIR/$s.sh" >&2; exit 2; }
done

RUN=$(mktemp -d "${TMPDIR:-/tmp}/talon-vm-run.XXXXXX")
HOSTDIR=$RUN/host
BUILD=$RUN/build
mkdir -p "$HOSTDIR" "$BUILD"
LOG=$RUN/guest.log
SUMMARY=$RUN/summary.txt
: >"$SUMMARY"
say() { echo "vm: $*" | tee -a "$SUMMARY"; }
say "run directory $RUN, steps: $STEPS"

# ------------------------------------------------------------------ host services, stopped at exit by PID
HOST_PIDS=()
HOST_CLEANUPS=()
QEMU_PID=""
cleanup() {
	local rc=$?
	set +e
	if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
		# QEMU_PID is timeout(1), which passes SIGTERM on to QEMU
		kill "$QEMU_PID" 2>/dev/null
		for _ in $(seq 30); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$QEMU_PID" 2>/dev/null && kill -9 "$QEMU_PID" 2>/dev/null
	fi
	for c in "${HOST_CLEANUPS[@]}"; do (cd "$HOSTDIR" && bash "$c" cleanup >>"$HOSTDIR/hooks.log" 2>&1); done
	for p in "${HOST_PIDS[@]}"; do
		if kill -0 "$p" 2>/dev/null; then
			kill "$p" 2>/dev/null
			for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
			kill -0 "$p" 2>/dev/null && { echo "vm: pid $p ignored SIGTERM, SIGKILL"; kill -9 "$p" 2>/dev/null; }
		fi
	done
	if [ "$rc" = 0 ] && [ "$KEEP" != 1 ]; then rm -rf "$RUN"; else echo "vm: logs kept in $RUN"; fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# a free TCP port on 127.0.0.1 (nothing accepts a connection to it, and not handed out twice in a run)
# A port for a listener that starts later (the guest's targets, SPDK's
# exports): below the kernel's ephemeral range, so no outgoing connection of
# another process can take it meanwhile (seen: an export's port from the
# ephemeral range was in use as a client's local port by the time spdk_tgt
# listened); 32 ports of room above it for runs of consecutive ports.
free_port() {
	local p lo
	lo=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
	[ "$lo" -gt 20100 ] || lo=32768
	for _ in $(seq 200); do
		p=$((20000 + RANDOM % (lo - 20032)))
		grep -qx "$p" "$HOSTDIR/ports" 2>/dev/null && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p" >>"$HOSTDIR/ports"; echo "$p"; return 0; fi
	done
	return 1
}
export -f free_port
export HOSTDIR
printf '#!/bin/bash\nHOSTDIR=%q\n%s\nfree_port\n' "$HOSTDIR" "$(declare -f free_port)" >"$HOSTDIR/free-port"
chmod +x "$HOSTDIR/free-port"

# ------------------------------------------------------------------ 1. packages (cached)
PKGS=(
	busybox-static kmod libkmod2
	# QEMU is extracted, never apt-get installed: on this image qemu-utils (bookworm-backports)
	# Breaks qemu-system-common << 8.0, so installing qemu-system-x86 would remove qemu-utils
	qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu
	libcapstone4 libfdt1 libibverbs1 libpmem1 librdmacm1 libslirp0 libvdeplug2 libndctl6 libdaxctl1
	libnl-3-200 libnl-route-3-200 libbrlapi0.8 libcacard0 libepoxy0 libsndio7.0 libspice-server1
	libusb-1.0-0 libusbredirparser1 libaio1 liburing2 libgbm1 libvirglrenderer1 libjpeg62-turbo libpng16-16
	# guest userland
	nvme-cli libnvme1 libjson-c5 open-iscsi libisns0 libopeniscsiusr
	fio libnuma1 libnbd0 libpmemblk1 libboost-thread1.74.0 libfmt9 libgfxdr0 libglusterfs0
	libgfrpc0 libgfapi0 librados2 librbd1
	# the nfs-backup step's server (the kernel's nfsd; exportfs, rpc.mountd, rpc.nfsd)
	nfs-kernel-server libtirpc3 libtirpc-common libwrap0 libnsl2 libgssapi-krb5-2 libkrb5-3
	libk5crypto3 libkrb5support0 libkeyutils1
)
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
T0=$(now)
KEY=$(printf '%s\n' "${PKGS[@]}" | sort | md5sum | cut -c1-12)
ROOT=$CACHE/root-$KEY
if [ -f "$ROOT/.complete" ]; then
	KVER=$(cat "$ROOT/.complete")
	say "packages: cached in $ROOT (kernel $KVER)"
else
	if ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then
		say "apt package lists are empty: apt-get update"
		apt-get update -qq >"$HOSTDIR/apt-update.log" 2>&1 || skip "apt-get update failed (no apt sources/network?): $(tail -2 "$HOSTDIR/apt-update.log")"
	fi
	KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: \(linux-image-6\.1[^ ]*\)$/\1/p' | head -1)
	[ -n "$KPKG" ] || skip "cannot resolve linux-image-amd64 to a 6.1 kernel package (apt sources are not Debian 12?)"
	KVER=${KPKG#linux-image-}
	DEBS=$CACHE/debs
	mkdir -p "$DEBS"
	if ! (cd "$DEBS" && apt-get download "$KPKG" "${PKGS[@]}") >"$HOSTDIR/apt-download.log" 2>&1; then
		cat "$HOSTDIR/apt-download.log"
		skip "apt-get download failed"
	fi
	T1=$(now)
	say "apt-get download of $((${#PKGS[@]} + 1)) packages: $(elapsed "$T0" "$T1")s ($(du -sh "$DEBS" | cut -f1) in $DEBS)"
	rm -rf "$ROOT.tmp"
	mkdir -p "$ROOT.tmp"
	for p in "$KPKG" "${PKGS[@]}"; do
		# the newest downloaded version of each package
		d=$(ls -t "$DEBS/${p}_"*.deb | head -1)
		dpkg -x "$d" "$ROOT.tmp"
	done
	HL=$ROOT.tmp/usr/lib/x86_64-linux-gnu:$ROOT.tmp/lib/x86_64-linux-gnu
	# kmod acts as depmod/modprobe when called through links of those names
	mkdir -p "$ROOT.tmp/.tools"
	ln -s ../bin/kmod "$ROOT.tmp/.tools/depmod"
	ln -s ../bin/kmod "$ROOT.tmp/.tools/modprobe"
	LD_LIBRARY_PATH=$HL "$ROOT.tmp/.tools/depmod" -b "$ROOT.tmp" "$KVER"
	# PVH boot of the uncompressed vmlinux: skips SeaBIOS and in-guest decompression (~3 s under TCG)
	K=$ROOT.tmp/boot/vmlinuz-$KVER
	OFF=$(LC_ALL=C grep -obUaP '\xfd7zXZ' "$K" | head -1 | cut -d: -f1)
	tail -c +$((OFF + 1)) "$K" | xz -dc >"$ROOT.tmp/vmlinux" 2>/dev/null || true
	[ -s "$ROOT.tmp/vmlinux" ] || { echo "cannot extract vmlinux from $K" >&2; exit 2; }
	echo "$KVER" >"$ROOT.tmp/.complete"
	rm -rf "$ROOT"
	mv "$ROOT.tmp" "$ROOT"
	say "dpkg -x + depmod + vmlinux: $(elapsed "$T1" "$(now)")s, tree $(du -sh "$ROOT" | cut -f1)"
fi
flock -u 9
exec 9>&-
HOSTLIBS=$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu:$ROOT/usr/lib/x86_64-linux-gnu/ceph
T_PKG=$(elapsed "$T0" "$(now)")

# ------------------------------------------------------------------ 2. host hooks (setup)
GUEST_ENV=$BUILD/env
: >"$GUEST_ENV"
# the guest's serial log (host-stamped lines), which setup's watchers may follow
: >"$LOG"
export TALON_VM_GUEST_LOG=$LOG
export TALON_VM_TALON_BIN=$TALON_BIN TALON_VM_FREE_PORT=$HOSTDIR/free-port TALON_VM_ROOT=$ROOT TALON_VM_HOSTLIBS=$HOSTLIBS TALON_VM_HOST_LIB=$HERE/host
declare -A STEP_SKIP=()
STAGE_FILES=()
for s in "${STEP_LIST[@]}"; do
	h=$STEPS_DIR/$s.host
	[ -f "$h" ] || continue
	HOST_CLEANUPS+=("$h")
	if ! out=$(cd "$HOSTDIR" && bash "$h" setup 2>>"$HOSTDIR/hooks.log"); then
		say "host setup of step $s failed:"; tail -20 "$HOSTDIR/hooks.log"; exit 2
	fi
	while IFS= read -r line; do
		case "$line" in
		"export TALON_HOST_"*=*) echo "$line" >>"$GUEST_ENV" ;;
		"pid "*) HOST_PIDS+=("${line#pid }") ;;
		"skip "*) STEP_SKIP[$s]=${line#skip } ;;
		"file /"*) STAGE_FILES+=("${line#file }") ;;
		"") ;;
		*) echo "$s.host: $line" >>"$HOSTDIR/hooks.log" ;;
		esac
	done <<<"$out"
done

# ------------------------------------------------------------------ 3. initramfs
T0=$(now)
STAGE=$BUILD/initramfs
mkdir -p "$STAGE"/{bin,sbin,usr/bin,usr/sbin,lib/x86_64-linux-gnu,lib64,etc/iscsi,etc/nvme,proc,sys,dev,run,tmp,var/lib/iscsi,root,steps}
ln -s ../run "$STAGE/var/run"
cp "$ROOT/bin/busybox" "$STAGE/bin/busybox"
for a in $("$STAGE/bin/busybox" --list-full); do
	[ -e "$STAGE/$a" ] || ln -s /bin/busybox "$STAGE/$a"
done
BINS=("$ROOT/bin/kmod" "$ROOT/usr/sbin/nvme" "$ROOT/sbin/iscsiadm" "$ROOT/sbin/iscsid" "$ROOT/sbin/iscsi-iname" "$ROOT/usr/bin/fio"
	"$ROOT/usr/sbin/exportfs" "$ROOT/usr/sbin/rpc.mountd" "$ROOT/usr/sbin/rpc.nfsd")
cp "$ROOT/bin/kmod" "$STAGE/bin/kmod"
for t in modprobe lsmod rmmod insmod modinfo depmod; do ln -sf /bin/kmod "$STAGE/sbin/$t"; done
cp "$ROOT/usr/sbin/nvme" "$STAGE/usr/sbin/"
cp "$ROOT/sbin/iscsiadm" "$ROOT/sbin/iscsid" "$ROOT/sbin/iscsi-iname" "$STAGE/sbin/"
cp "$ROOT/etc/iscsi/iscsid.conf" "$STAGE/etc/iscsi/"
cp "$ROOT/usr/bin/fio" "$STAGE/usr/bin/"
cp "$ROOT/usr/sbin/exportfs" "$ROOT/usr/sbin/rpc.mountd" "$ROOT/usr/sbin/rpc.nfsd" "$STAGE/usr/sbin/"
# without debug info (a debug build is >100 MB; the guest loads the initramfs at TCG speed)
if command -v objcopy >/dev/null; then
	objcopy --strip-debug "$TALON_BIN" "$STAGE/usr/bin/talon"
else
	cp "$TALON_BIN" "$STAGE/usr/bin/talon"
fi
# programs the hooks asked for, at their host path
for f in "${STAGE_FILES[@]}"; do
	mkdir -p "$STAGE/$(dirname "$f")"
	objcopy --strip-debug "$f" "$STAGE/$f" 2>/dev/null || cp "$f" "$STAGE/$f"
done
# shared libraries: the extracted tree first, then the host (talon links against the host's glibc)
for b in "${BINS[@]}" "$TALON_BIN" "${STAGE_FILES[@]}"; do
	LD_LIBRARY_PATH=$HOSTLIBS ldd "$b" | awk '/=> \//{print $1, $3} /^\t\/lib64/{print "INTERP", $1}'
done | sort -u | while read -r name path; do
	if [ "$name" = INTERP ]; then
		cp -L "$path" "$STAGE/lib64/"
	else
		cp -L "$path" "$STAGE/lib/x86_64-linux-gnu/$name"
	fi
done
printf '/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n' >"$STAGE/etc/ld.so.conf"
ldconfig -r "$STAGE"
MODS="nvme-core nvme nvme-fabrics nvme-tcp nvmet nvmet-tcp vfio vfio-pci vfio_iommu_type1 uio uio_pci_generic
      iscsi_tcp libiscsi libiscsi_tcp scsi_transport_iscsi sd_mod virtio_pci virtio_net brd loop configfs
      crc32c_generic dm-mod ext4 nfsd nfsv4"
for m in $MODS; do
	LD_LIBRARY_PATH=$HOSTLIBS "$ROOT/.tools/modprobe" -d "$ROOT" -S "$KVER" --show-depends "$m" | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
	rel=${ko#"$ROOT"}
	mkdir -p "$STAGE/$(dirname "$rel")"
	cp "$ko" "$STAGE/$rel"
done
cp "$ROOT/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$STAGE/lib/modules/$KVER/"
LD_LIBRARY_PATH=$HOSTLIBS "$ROOT/.tools/depmod" -b "$STAGE" "$KVER"
NMODS=$(find "$STAGE/lib/modules" -name '*.ko*' | wc -l)
echo "root:x:0:0:root:/root:/bin/sh" >"$STAGE/etc/passwd"
echo "root:x:0:" >"$STAGE/etc/group"
cp "$HERE/guest/init" "$STAGE/init"
chmod +x "$STAGE/init"
: >"$STAGE/steps/order"
for s in "${STEP_LIST[@]}"; do
	[ -n "${STEP_SKIP[$s]:-}" ] && continue
	cp "$STEPS_DIR/$s.sh" "$STAGE/steps/$s.sh"
	chmod +x "$STAGE/steps/$s.sh"
	echo "$s" >>"$STAGE/steps/order"
done
{
	echo "export TALON_HOST_ADDR=10.0.2.2"
	echo "export TALON_NVME_SERIAL=talon-test-1"
	cat "$GUEST_ENV"
} >"$STAGE/etc/talon-vm.env"
(cd "$STAGE" && find . | "$ROOT/bin/busybox" cpio -o -H newc 2>/dev/null) >"$BUILD/initramfs.cpio"
T_BUILD=$(elapsed "$T0" "$(now)")
say "initramfs: ${T_BUILD}s, $NMODS modules, $(du -sh "$BUILD/initramfs.cpio" | cut -f1)"

# ------------------------------------------------------------------ 4. boot
DISK=$BUILD/nvme-disk.img
printf 'TALON-NVME-PCI-MARKER\n' >"$DISK"
truncate -s 256M "$DISK"
QEMU=$ROOT/usr/bin/qemu-system-x86_64
QARGS=(-L "$ROOT/usr/share/qemu" -L "$ROOT/usr/share/seabios" -L "$ROOT/usr/lib/ipxe/qemu")
if [ "$ACCEL" = kvm ]; then
	QARGS+=(-accel kvm -cpu host,-arch-capabilities)
else
	QARGS+=(-accel tcg,thread=multi -cpu max)
fi
# no_timer_check: on a loaded host the TCG guest's boot-time check that the timer ticks through
# the interrupt-remapped IO-APIC can miss its window, and the kernel panics ("timer doesn't work
# through Interrupt-remapped IO-APIC"; seen here with the suite running beside it)
APPEND="console=ttyS0 quiet panic=-1 intel_iommu=on iommu=pt no_timer_check"
QARGS+=(-machine q35 -device intel-iommu,aw-bits=48
	-nodefaults -nographic -serial stdio -monitor none -no-reboot -m "$MEM" -smp "$SMP"
	-kernel "$ROOT/vmlinux" -initrd "$BUILD/initramfs.cpio" -append "$APPEND"
	-drive "file=$DISK,if=none,id=d0,format=raw" -device nvme,serial=talon-test-1,drive=d0
	-netdev user,id=n0,restrict=off -device virtio-net-pci,netdev=n0,romfile=)
if [ -z "$TIMEOUT" ]; then
	# each step is bounded by its own vm-timeout in the guest (default 120 s, as /init)
	TIMEOUT=180
	for s in "${STEP_LIST[@]}"; do
		[ -n "${STEP_SKIP[$s]:-}" ] && continue
		t=$(sed -n 's/^# vm-timeout: *\([0-9][0-9]*\).*/\1/p' "$STEPS_DIR/$s.sh" | head -1)
		TIMEOUT=$((TIMEOUT + ${t:-120}))
	done
fi
say "QEMU timeout ${TIMEOUT}s"
echo "LD_LIBRARY_PATH=$HOSTLIBS $QEMU ${QARGS[*]}" >"$RUN/qemu-cmdline.txt"
T_BOOT=$(now)
: >"$LOG"
set +e
# QEMU runs in the background (PID known for cleanup); its serial output is stamped with host time
coproc QEMU_CO { LD_LIBRARY_PATH=$HOSTLIBS exec timeout -k 5 "$TIMEOUT" "$QEMU" "${QARGS[@]}" </dev/null 2>&1; }
QEMU_PID=$QEMU_CO_PID
exec 8<&"${QEMU_CO[0]}"
while IFS= read -r line <&8; do
	line=${line%$'\r'}
	printf '%s %s\n' "$EPOCHREALTIME" "$line" >>"$LOG"
	case "$line" in
	"@@ "*) echo "vm: guest: ${line#@@ }" ;;
	esac
done
wait "$QEMU_PID"
QRC=$?
QEMU_PID=""
set -e
T_END=$(now)
INIT_T=$(awk '/@@ INIT START/{print $1; exit}' "$LOG")
say "qemu exit $QRC (124 = timeout after ${TIMEOUT}s); wall $(elapsed "$T_BOOT" "$T_END")s; boot to /init ${INIT_T:+$(elapsed "$T_BOOT" "$INIT_T")}s"

# ------------------------------------------------------------------ 5. results
PASS=0
FAIL=0
export TALON_VM_GUEST_LOG=$LOG
SKIPPED=0
for s in "${STEP_LIST[@]}"; do
	if [ -n "${STEP_SKIP[$s]:-}" ]; then
		SKIPPED=$((SKIPPED + 1)); say "step $s SKIP: ${STEP_SKIP[$s]}"; continue
	fi
	r=$(grep -m1 -E "@@ STEP $s (PASS|FAIL)" "$LOG" | sed 's/^[0-9.]* @@ STEP //' || true)
	if [ -z "$r" ]; then r="$s FAIL (no result: guest crashed or timed out)"; fi
	case "$r" in *" PASS"*) PASS=$((PASS + 1)) ;; *) FAIL=$((FAIL + 1)) ;; esac
	say "step $r"
	h=$STEPS_DIR/$s.host
	if [ -f "$h" ] && [ -z "${STEP_SKIP[$s]:-}" ]; then
		if (cd "$HOSTDIR" && bash "$h" check >"$HOSTDIR/$s.check.log" 2>&1); then
			PASS=$((PASS + 1)); say "step $s.host PASS"
		else
			FAIL=$((FAIL + 1)); say "step $s.host FAIL (see $HOSTDIR/hooks.log)"
		fi
		# what the check measured, in the run's output whatever the result
		grep -E "^$s: " "$HOSTDIR/$s.check.log" | sed 's/^/vm: /' || true
		cat "$HOSTDIR/$s.check.log" >>"$HOSTDIR/hooks.log"
	fi
done
grep -q '@@ RESULTS' "$LOG" || { say "the guest never printed its RESULTS line"; FAIL=$((FAIL + 1)); }
if [ "$FAIL" != 0 ]; then
	echo "---- guest log (last 80 lines; full log $LOG) ----"
	tail -80 "$LOG" | cut -d' ' -f2-
fi
say "timings: packages ${T_PKG}s, initramfs ${T_BUILD}s, total $(elapsed "$T_ALL" "$(now)")s"
[ "$SKIPPED" = 0 ] || say "$SKIPPED step(s) skipped (see the SKIP lines)"
echo "vm-tests: $PASS passed, $FAIL failed" | tee -a "$SUMMARY"
[ "$FAIL" = 0 ] || exit 1
