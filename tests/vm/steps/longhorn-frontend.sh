#!/bin/sh
# A Longhorn engine-frontend on the guest's kernel: `talon serve --longhorn-listen` runs in the
# guest (no SPDK here: an engine-frontend needs none), and Longhorn's InstanceCreate of an
# engine-frontend (the longhorn_client of tests/vm.rs, on Longhorn's gRPC protocol) attaches the
# export of the engine the host's talon runs (raid1 of two replicas, guest 10.0.2.2 = host
# 127.0.0.1) through the kernel's NVMe/TCP initiator; the instance reports /dev/longhorn/<volume>
# as its endpoint. 2 MiB written at offset 1 MiB through it read back equal (O_DIRECT); deleting
# the instance leaves no device and no controller; a second engine-frontend reads the same bytes.
# Skipped by the harness without SPDK on the host.
# vm-timeout: 300
# vm-order: early
set -u
VOL=$TALON_HOST_LH_VOLUME
D=/tmp/lh-guest
fail=0
say() { echo "longhorn-frontend: $*"; }
ctrls() { for c in /sys/class/nvme/nvme*; do [ "$(cat $c/transport 2>/dev/null)" = tcp ] && basename $c; done; }
lh() {
	TALON_LH_ADDR=127.0.0.1:8500 TALON_LH_CALL="$*" "$TALON_HOST_LH_CLIENT" --ignored --exact longhorn_client \
		--nocapture >$D/call.out 2>&1
	cat $D/call.out >>$D/client.log
	sed -n 's/^LH [a-z]*=//p' $D/call.out | tail -n1
}
mkdir -p $D/data/nvme
# the host identity the host's engine admits (allowedHosts there)
echo "$TALON_HOST_LH_GUEST_ID" >$D/data/nvme/hostid
echo "nqn.2014-08.org.nvmexpress:uuid:$TALON_HOST_LH_GUEST_ID" >$D/data/nvme/hostnqn
cat >$D/config.yaml <<CFG
node:
  hugepages: "off"
CFG
talon serve --data-dir $D/data --run-dir $D/run --socket $D/talon.sock --config $D/config.yaml \
	--longhorn-listen 127.0.0.1:8500 >$D/serve.log 2>&1 &
PID=$!
TARGET=$TALON_HOST_ADDR:$TALON_HOST_LH_PORT

EP=$(lh frontend $VOL-ef-0 $VOL $TALON_HOST_LH_ENGINE $TARGET $TALON_HOST_LH_SIZE)
say "engine-frontend endpoint: ${EP:-none}"
[ "$EP" = /dev/longhorn/$VOL ] && [ -b "$EP" ] || { say "FAIL no block device at /dev/longhorn/$VOL"; tail -20 $D/client.log; tail -20 $D/serve.log; kill $PID; exit 1; }
dd if=/dev/urandom of=/tmp/p bs=1M count=2 2>/dev/null
dd if=/tmp/p of="$EP" bs=1M seek=1 count=2 oflag=direct 2>/dev/null || fail=1
A=$(md5sum </tmp/p | cut -c1-32)
B=$(dd if="$EP" bs=1M skip=1 count=2 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
GONE=$(lh delete engine-frontend $VOL-ef-0)
[ "$GONE" = $VOL-ef-0 ] || { say "FAIL delete of the engine-frontend"; fail=1; }
[ -z "$(ctrls)" ] || { say "FAIL controllers left after the delete: $(ctrls)"; fail=1; }
[ ! -e /dev/longhorn/$VOL ] || { say "FAIL /dev/longhorn/$VOL left after the delete"; fail=1; }

EP2=$(lh frontend $VOL-ef-1 $VOL $TALON_HOST_LH_ENGINE $TARGET $TALON_HOST_LH_SIZE)
C=$(dd if="$EP2" bs=1M skip=1 count=2 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
[ "$(lh delete engine-frontend $VOL-ef-1)" = $VOL-ef-1 ] || fail=1
[ -z "$(ctrls)" ] && [ ! -e /dev/longhorn/$VOL ] || { say "FAIL left after the second delete: $(ctrls)"; fail=1; }
echo "LH_MD5=$A read-back=$B reattached=$C endpoint=$EP"
[ "$A" = "$B" ] && [ "$A" = "$C" ] || fail=1
kill $PID 2>/dev/null
wait $PID 2>/dev/null
[ $fail = 0 ] || tail -30 $D/serve.log
exit $fail
