#!/bin/sh
# talon's iSCSI frontend on a real kernel. iscsid runs like Talos' iscsi-tools extension: in its
# own mount, UTS and IPC namespaces with its own /etc/iscsi, /var/lib/iscsi and /run (tmpfs), so
# its node database and config exist only there. It keeps the guest's network namespace for the
# main part: the kernel serves iSCSI's netlink control socket in the initial network namespace
# only, which the last part shows by moving eth0 into a netns of iscsid's own (discovery through
# it works, login cannot). talon runs in a mount namespace where iscsiadm does not exist (as on
# Talos' host)
# and logs in through iscsid's namespaces to the host's tgtd at $TALON_HOST_ADDR; data written
# through /dev/talon/<vol> is checked in the LUN file on the host (iscsi-attach.host); two
# concurrent attaches make one session (per-volume lock); bad input fails fast leaving no session
# and no node record; detach leaves nothing.
# vm-timeout: 300 (TCG: 86 s alone, 157 s with a build beside it)
set -u
P=$TALON_HOST_ADDR:$TALON_HOST_ISCSI_ATTACH_PORT
IQN=$TALON_HOST_ISCSI_ATTACH_IQN
V=vm-attach
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# ---- the "extension": iscsid in its own namespaces
cp /etc/iscsi/iscsid.conf /tmp/iscsid.conf
echo "InitiatorName=$(iscsi-iname)" >/tmp/initiatorname.iscsi
cat >/tmp/ext.sh <<'X'
mount -t tmpfs tmpfs /etc/iscsi && mount -t tmpfs tmpfs /var/lib/iscsi && mount -t tmpfs tmpfs /run || exit 1
mkdir -p /run/lock/iscsi
cp /tmp/iscsid.conf /tmp/initiatorname.iscsi /etc/iscsi/
hostname iscsi-ext
exec iscsid -f
X
setsid unshare --mount --uts --ipc --fork sh /tmp/ext.sh >/tmp/iscsid.log 2>&1 &
UNSHARE=$!
ISCSID=""
i=0
while [ $i -lt 100 ]; do
	ISCSID=$(pidof iscsid | tr ' ' '\n' | head -1)
	[ -n "$ISCSID" ] && grep -q ISCSIADM_ABSTRACT /proc/net/unix && break
	sleep 0.1; i=$((i + 1))
done
echo "iscsid pid ${ISCSID:-none}: mnt $(readlink /proc/$ISCSID/ns/mnt) (host $(readlink /proc/1/ns/mnt)), uts $(readlink /proc/$ISCSID/ns/uts), net $(readlink /proc/$ISCSID/ns/net)"
[ -n "$ISCSID" ] || { cat /tmp/iscsid.log; exit 1; }
[ "$(readlink /proc/$ISCSID/ns/mnt)" != "$(readlink /proc/1/ns/mnt)" ] || bad "iscsid shares the host mount namespace"
[ "$(readlink /proc/$ISCSID/ns/uts)" != "$(readlink /proc/1/ns/uts)" ] || bad "iscsid shares the host UTS namespace"

# ---- the "host": a mount namespace without iscsiadm
printf '#!/bin/sh\necho "iscsiadm: not installed on this host" >&2\nexit 127\n' >/tmp/no-iscsiadm
chmod +x /tmp/no-iscsiadm
H() { unshare --mount sh -c 'mount --bind /tmp/no-iscsiadm /sbin/iscsiadm && exec "$@"' sh "$@"; }
H iscsiadm -m session >/tmp/o 2>&1 && bad "iscsiadm works on the host: the test proves nothing"
echo "iscsiadm on the host: $(cat /tmp/o)"
# state as iscsid's namespace sees it
ext() { nsenter -t "$ISCSID" -m -u -i "$@"; }
# node records: /etc/iscsi/nodes (Debian's build) or /var/lib/iscsi/nodes (upstream default)
NODEDIRS="/etc/iscsi/nodes /var/lib/iscsi/nodes"
nodes() { ext sh -c "ls $NODEDIRS 2>/dev/null" | grep '^iqn'; }
host_nodes() { sh -c "ls $NODEDIRS 2>/dev/null" | grep '^iqn'; }
sessions() { ls /sys/class/iscsi_session 2>/dev/null; }
clean() { # $1: what was tried
	[ -z "$(sessions)" ] || bad "$1 left a session: $(sessions)"
	[ -z "$(nodes)" ] || bad "$1 left node records: $(nodes)"
	[ ! -e /dev/talon/$V ] || bad "$1 left /dev/talon/$V"
}
expect_fail() { # what pattern cmd...
	what=$1; pat=$2; shift 2
	t0=$(cut -d' ' -f1 /proc/uptime)
	if H "$@" >/tmp/o 2>&1; then bad "$what succeeded: $(cat /tmp/o)"; return; fi
	echo "$what -> ($(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1fs", b-a}')) $(cat /tmp/o)"
	grep -q "$pat" /tmp/o || bad "$what: error does not say '$pat'"
	clean "$what"
}

# ---- bad input first: clear errors, bounded, nothing left
expect_fail "injecting volume name" "invalid volume" talon attach iscsi --volume 'v,x;-o delete' --portal "$P" --iqn "$IQN"
expect_fail "injecting IQN" "invalid IQN" talon attach iscsi --volume $V --portal "$P" --iqn "$IQN -o delete"
expect_fail "wrong IQN" "does not offer target iqn.2025-01.io.talon:nope" talon attach iscsi --volume $V --portal "$P" --iqn iqn.2025-01.io.talon:nope
expect_fail "closed port" "discovery at $TALON_HOST_ADDR:1" talon attach iscsi --volume $V --portal "$TALON_HOST_ADDR:1" --iqn "$IQN"
expect_fail "unreachable portal" "192.0.2.1:3260" talon attach iscsi --volume $V --portal 192.0.2.1:3260 --iqn "$IQN" --discovery-timeout 4
expect_fail "missing LUN" "no block device for LUN 7" talon attach iscsi --volume $V --portal "$P" --iqn "$IQN" --lun 7 --device-timeout 3

# ---- two concurrent attaches of one volume: the lock in the host's /run serialises them
T0=$(cut -d' ' -f1 /proc/uptime)
H talon attach iscsi --volume $V --portal "$P" --iqn "$IQN" >/tmp/a1 2>&1 &
A1=$!
H talon attach iscsi --volume $V --portal "$P" --iqn "$IQN" >/tmp/a2 2>&1 &
A2=$!
wait $A1 || bad "attach 1: $(cat /tmp/a1)"
wait $A2 || bad "attach 2: $(cat /tmp/a2)"
echo "two concurrent attaches took $(awk -v a="$T0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1fs", b-a}') (TCG, indicative)"
cat /tmp/a1 /tmp/a2
[ "$(cat /tmp/a1 /tmp/a2 | grep -c 'reused=true')" = 1 ] || bad "expected exactly one reused session"
[ "$(sessions | wc -l)" = 1 ] || bad "expected one session, have: $(sessions)"
SD=$(sed -n 's/.*device=\/dev\/\([a-z]*\) .*/\1/p' /tmp/a1)
SESSION=$(sed -n 's/.*session=\(session[0-9]*\).*/\1/p' /tmp/a1)
echo "device $SD session $SESSION; node records in iscsid's namespace: [$(nodes)]; in the host's: [$(host_nodes)]"
[ -b /dev/talon/$V ] || bad "/dev/talon/$V is not a block device"
[ "$(stat -c %t:%T /dev/talon/$V)" = "$(stat -c %t:%T /dev/$SD)" ] || bad "/dev/talon/$V is not /dev/$SD"
nodes | grep -qxF "$IQN" || bad "no node record for $IQN in iscsid's namespace"
PORTALS=$(ext sh -c "ls -d /etc/iscsi/nodes/$IQN/* /var/lib/iscsi/nodes/$IQN/* 2>/dev/null")
echo "node record portals: $PORTALS"
echo "$PORTALS" | grep -q "/$TALON_HOST_ADDR,$TALON_HOST_ISCSI_ATTACH_PORT" || bad "the node record is not for the reachable portal $P"
echo "$PORTALS" | grep -q "/127.0.0.1," && bad "a node record for tgtd's own bind address (what SendTargets names) was stored"
[ -z "$(host_nodes)" ] || bad "node records leaked into the host's /etc/iscsi or /var/lib/iscsi"
M=$(dd if=/dev/talon/$V bs=512 count=1 2>/dev/null | head -c 25)
echo "first bytes: $M"
[ "$M" = TALON-ISCSI-ATTACH-MARKER ] || bad "marker not read through /dev/talon/$V"
dd if=/dev/urandom of=/tmp/p bs=1M count=2 2>/dev/null
dd if=/tmp/p of=/dev/talon/$V bs=1M seek=1 count=2 oflag=direct 2>/dev/null || bad "write through /dev/talon/$V"
R=$(dd if=/dev/talon/$V bs=1M skip=1 count=2 iflag=direct 2>/dev/null | md5sum | cut -c1-32)
W=$(md5sum </tmp/p | cut -c1-32)
[ "$R" = "$W" ] || bad "read back $R, wrote $W"
echo "ISCSI_ATTACH_MD5=$W"
H talon attach iscsi --volume $V --portal "$P" --iqn "$IQN" >/tmp/a3 2>&1 || bad "re-attach: $(cat /tmp/a3)"
grep -q "session=$SESSION reused=true" /tmp/a3 || bad "re-attach did not reuse $SESSION: $(cat /tmp/a3)"

# ---- detach
T0=$(cut -d' ' -f1 /proc/uptime)
H talon detach iscsi --volume $V >/tmp/d 2>&1 || bad "detach: $(cat /tmp/d)"
echo "detach took $(awk -v a="$T0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN{printf "%.1fs", b-a}') (TCG, indicative)"
cat /tmp/d
grep -q "sessions=$SESSION removed_path=true" /tmp/d || bad "detach did not log out $SESSION"
clean "detach"
H talon detach iscsi --volume $V --iqn "$IQN" >/tmp/d 2>&1 || bad "second detach: $(cat /tmp/d)"
echo "second detach: $(cat /tmp/d)"
echo "sessions after detach: [$(sessions)] node records: [$(nodes)]"

# ---- a target that admits one initiator name (as talon's V1 exports do): iscsid's default name
# is offered nothing; talon's interface "talon" carrying the admitted name logs in
ACL_IQN=$TALON_HOST_ISCSI_ACL_IQN
expect_fail "ACL target with iscsid's default name" "does not offer target $ACL_IQN" talon attach iscsi --volume acl --portal "$P" --iqn "$ACL_IQN"
H talon attach iscsi --volume acl --portal "$P" --iqn "$ACL_IQN" --initiator-name "$TALON_HOST_ISCSI_ACL_INITIATOR" >/tmp/a4 2>&1 ||
	bad "attach with the admitted initiator name: $(cat /tmp/a4)"
cat /tmp/a4
echo "interface talon: $(ext iscsiadm -m iface -I talon 2>&1 | grep initiatorname)"
M=$(dd if=/dev/talon/acl bs=512 count=1 2>/dev/null | head -c 22)
[ "$M" = TALON-ISCSI-ACL-MARKER ] || bad "marker not read through /dev/talon/acl (read '$M')"
H talon detach iscsi --volume acl --iqn "$ACL_IQN" >/tmp/d 2>&1 || bad "detach acl: $(cat /tmp/d)"
[ -z "$(sessions)" ] || bad "the ACL attach left a session: $(sessions)"

# ---- a target that requires CHAP besides the initiator name: without the credentials file the
# login is refused; with it (`--chap`, <data-dir>/iscsi-chap) the LUN reads
CHAP_IQN=$TALON_HOST_ISCSI_CHAP_IQN
mkdir -p /tmp/chapdata && chmod 700 /tmp/chapdata
printf 'user=vmchap\nsecret=wrong-secret-0123456789\n' >/tmp/chapdata/iscsi-chap
chmod 600 /tmp/chapdata/iscsi-chap
expect_fail "CHAP target without CHAP" "login to $CHAP_IQN" talon attach iscsi --volume chap --portal "$P" --iqn "$CHAP_IQN" --initiator-name "$TALON_HOST_ISCSI_ACL_INITIATOR"
expect_fail "CHAP target with a wrong secret" "login to $CHAP_IQN" talon attach iscsi --volume chap --portal "$P" --iqn "$CHAP_IQN" --initiator-name "$TALON_HOST_ISCSI_ACL_INITIATOR" --chap --data-dir /tmp/chapdata
printf 'user=vmchap\nsecret=%s\n' "$TALON_HOST_ISCSI_CHAP_SECRET" >/tmp/chapdata/iscsi-chap
# while it attaches, every process's argv is scanned for the secret (grep reads the pattern from
# a file, so the scanner's own argv does not carry it; NULs become newlines first: grep stops a
# line at a NUL); talon writes the secret into the node record instead
printf '%s\n' "$TALON_HOST_ISCSI_CHAP_SECRET" >/tmp/secret-pattern
: >/tmp/argv-hits
: >/tmp/argv-scans
argv_has_secret() { cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\0' '\n' | grep -qFf /tmp/secret-pattern; }
argv_hits() {
	for f in /proc/[0-9]*/cmdline; do
		tr '\0' '\n' <"$f" 2>/dev/null | grep -qFf /tmp/secret-pattern && echo "$f: $(tr '\0' ' ' <"$f" 2>/dev/null)"
	done
}
# the scanner sees a secret in argv: a process that carries it is found. The decoy lives until it
# is killed (a loaded TCG guest can take seconds per scan; a decoy on a timer raced it) and is
# scanned only once its argv is in place.
sh -c 'while :; do sleep 1; done' "$TALON_HOST_ISCSI_CHAP_SECRET" &
DECOY=$!
i=0
while ! tr '\0' '\n' <"/proc/$DECOY/cmdline" 2>/dev/null | grep -qFf /tmp/secret-pattern && [ $i -lt 100 ]; do
	sleep 0.1; i=$((i + 1))
done
argv_has_secret || bad "the argv scan does not see a secret in a process's argv"
argv_hits | grep -q "/proc/$DECOY/" || bad "the argv scan does not name the process carrying a secret"
kill $DECOY 2>/dev/null
wait $DECOY 2>/dev/null
(
	while [ ! -e /tmp/argv-scan-stop ]; do
		if argv_has_secret; then
			echo "a process's argv held the secret" >>/tmp/argv-hits
			argv_hits >>/tmp/argv-hits
		fi
		echo >>/tmp/argv-scans
	done
) &
SCAN=$!
H talon attach iscsi --volume chap --portal "$P" --iqn "$CHAP_IQN" --initiator-name "$TALON_HOST_ISCSI_ACL_INITIATOR" --chap --data-dir /tmp/chapdata >/tmp/a5 2>&1 ||
	bad "attach with CHAP: $(cat /tmp/a5)"
touch /tmp/argv-scan-stop
wait $SCAN 2>/dev/null
echo "argv scans during the CHAP attach: $(wc -l </tmp/argv-scans)"
[ -s /tmp/argv-hits ] && bad "the CHAP secret was in a process's argv: $(cat /tmp/argv-hits)"
[ "$(wc -l </tmp/argv-scans)" -gt 0 ] || bad "the argv scanner never ran"
REC=$(ext sh -c "find $NODEDIRS -path '*$CHAP_IQN*' -type f 2>/dev/null" | head -1)
echo "node record: $REC, mode $(ext stat -c %a "$REC" 2>/dev/null), $(ext grep -c '^node.session.auth' "$REC" 2>/dev/null) auth lines"
[ "$(ext stat -c %a "$REC" 2>/dev/null)" = 600 ] || bad "the node record holding the secret is not 0600"
ext grep -q '^node.session.auth.authmethod = CHAP' "$REC" || bad "the node record does not ask for CHAP"
cat /tmp/a5
M=$(dd if=/dev/talon/chap bs=512 count=1 2>/dev/null | head -c 23)
[ "$M" = TALON-ISCSI-CHAP-MARKER ] || bad "marker not read through /dev/talon/chap (read '$M')"
H talon detach iscsi --volume chap --iqn "$CHAP_IQN" >/tmp/d 2>&1 || bad "detach chap: $(cat /tmp/d)"
[ -z "$(sessions)" ] || bad "the CHAP attach left a session: $(sessions)"

OLD_ISCSID=$ISCSID
kill "$ISCSID" 2>/dev/null
wait $UNSHARE 2>/dev/null
# the old iscsid must be gone before the new one is looked up by name (a dying one was picked
# up once, and eth0 could not move into its namespace: "No such process")
i=0
while kill -0 "$OLD_ISCSID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done

# ---- iscsid in its own network namespace, holding eth0: talon's discovery runs in that namespace
# (the guest's own has no route to the host then) and works; the login fails because the kernel
# serves iSCSI's netlink control socket in the initial network namespace only (iscsid logs
# "sendmsg: bug? ctrl_fd" and exits). Nothing may be left behind; eth0 comes back to the guest.
setsid unshare --mount --uts --ipc --net --fork sh /tmp/ext.sh >/tmp/iscsid-netns.log 2>&1 &
U2=$!
ISCSID=""
i=0
while [ -z "$ISCSID" ] && [ $i -lt 100 ]; do ISCSID=$(pidof iscsid | tr ' ' '\n' | grep -vx "$OLD_ISCSID" | head -1); sleep 0.1; i=$((i + 1)); done
sleep 0.5
if [ -n "$ISCSID" ] && ip link set eth0 netns "$ISCSID"; then
	nsenter -t "$ISCSID" -n sh -c 'ip link set lo up; ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2' || bad "cannot configure eth0 in iscsid's network namespace"
	expect_fail "attach through iscsid in its own network namespace" "login to $IQN at $P failed" talon attach iscsi --volume $V --portal "$P" --iqn "$IQN"
else
	bad "cannot move eth0 into iscsid's network namespace"
fi
for p in $(pidof iscsid); do kill $p; done
wait $U2 2>/dev/null
echo "iscsid in its own network namespace said: $(grep -iv initiatorname /tmp/iscsid-netns.log | head -3 | tr '\n' ' ')"
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
ip link set eth0 up
ip addr show eth0 | grep -q 10.0.2.15 || ip addr add 10.0.2.15/24 dev eth0
ip route | grep -q default || ip route add default via 10.0.2.2
ip addr show eth0 | grep -q 10.0.2.15 || bad "eth0 did not come back"
[ $fail = 0 ] || { echo "---- iscsid log"; cat /tmp/iscsid.log; }
exit $fail
