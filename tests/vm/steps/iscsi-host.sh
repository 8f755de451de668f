#!/bin/sh
# The guest's iSCSI initiator (iscsid + iscsiadm) logs in to the host's tgtd at
# $TALON_HOST_ADDR:$TALON_HOST_ISCSI_PORT, writes 2 MiB at offset 1 MiB (the host hook checks them
# in its LUN file), logs out and leaves no session. Proves the harness's host-service path; talon's
# own iSCSI frontend gets its steps with issue 6's iSCSI part.
# vm-timeout: 90
set -u
P=$TALON_HOST_ADDR:$TALON_HOST_ISCSI_PORT
IQN=$TALON_HOST_ISCSI_IQN
fail=0
echo "InitiatorName=$(iscsi-iname)" >/etc/iscsi/initiatorname.iscsi
mkdir -p /run/lock/iscsi /var/lib/iscsi
# its own session: iscsid signals its whole process group when it stops
setsid iscsid -f >/tmp/iscsid.log 2>&1 &
ISCSID=$!
i=0; while [ ! -S /run/iscsid.sock ] && ! grep -q iscsid /proc/net/unix && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
ls /sys/block | sort >/tmp/before
timeout 30 iscsiadm -m discovery -t sendtargets -p "$P" || fail=1
# tgtd's SendTargets answer names its own bind address (127.0.0.1 on the host): add the node
# with the portal as the guest reaches it
iscsiadm -m node -o new -T "$IQN" -p "$P" >/dev/null || fail=1
timeout 60 iscsiadm -m node -T "$IQN" -p "$P" --login || fail=1
SD=""
i=0
while [ $i -lt 100 ]; do
	SD=$(ls /sys/block | grep -vxF -f /tmp/before | grep '^sd' | head -1)
	[ -n "$SD" ] && [ -b /dev/$SD ] && break
	sleep 0.1; i=$((i+1))
done
echo "disk: /dev/$SD"
if [ -n "$SD" ] && [ -b /dev/$SD ]; then
	M=$(dd if=/dev/$SD bs=512 count=1 2>/dev/null | head -c 23)
	echo "first bytes: $M"
	[ "$M" = TALON-ISCSI-HOST-MARKER ] || fail=1
	dd if=/dev/urandom of=/tmp/p bs=1M count=2 2>/dev/null
	dd if=/tmp/p of=/dev/$SD bs=1M seek=1 count=2 oflag=direct 2>/dev/null || fail=1
	echo "ISCSI_MD5=$(md5sum </tmp/p | cut -c1-32)"
else
	fail=1
fi
timeout 30 iscsiadm -m node -T "$IQN" -p "$P" --logout || fail=1
iscsiadm -m node -o delete -T "$IQN" -p "$P" || fail=1
S=$(iscsiadm -m session 2>&1)
echo "sessions after logout: $S"
echo "$S" | grep -q "$IQN" && fail=1
ls /sys/class/iscsi_session/ | grep -q . && { echo "session left in sysfs"; fail=1; }
kill $ISCSID
wait $ISCSID 2>/dev/null
exit $fail
