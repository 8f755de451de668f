# tests/vm/host/tgtd.sh - sourced by step host hooks (<step>.host) that need an iSCSI target on
# the host: the host's tgtd (package tgt), on a free port of 127.0.0.1 only, with its IPC socket
# in the hook's directory so that several runs (and other tgtd users) never meet.
#
#   . "$TALON_VM_HOST_LIB/tgtd.sh"
#   tgtd_start                      -> TGTD_PID, TGTD_PORT; prints "pid <PID>" for the harness
#   tgtd_target 1 IQN FILE          new target tid 1 with LUN 1 backed by FILE, open to all initiators
#   tgtd_stop                       delete targets and shut tgtd down (it ignores SIGTERM)
export TGT_IPC_SOCKET=$PWD/tgtd/socket
TGTADM=${TGTADM:-tgtadm}
TGTD=${TGTD:-tgtd}

tgtd_start() {
	command -v "$TGTD" >/dev/null || { echo "skip tgtd is not installed (package tgt)"; return 1; }
	mkdir -p "$PWD/tgtd"
	TGTD_PORT=$("$TALON_VM_FREE_PORT")
	"$TGTD" -f --iscsi "portal=127.0.0.1:$TGTD_PORT" >"$PWD/tgtd/tgtd.log" 2>&1 </dev/null &
	TGTD_PID=$!
	echo "$TGTD_PID" >"$PWD/tgtd/pid"
	echo "pid $TGTD_PID"
	for _ in $(seq 50); do [ -S "$TGT_IPC_SOCKET.0" ] && break; sleep 0.1; done
	[ -S "$TGT_IPC_SOCKET.0" ] || { echo "tgtd did not create $TGT_IPC_SOCKET.0" >&2; cat "$PWD/tgtd/tgtd.log" >&2; return 1; }
	# tgtd silently falls back to all addresses when its portal is taken: refuse that
	for _ in $(seq 20); do
		ss -Hltnp | grep -q "pid=$TGTD_PID," && break
		sleep 0.1
	done
	if ss -Hltnp | grep "pid=$TGTD_PID," | grep -vq "127.0.0.1:$TGTD_PORT"; then
		echo "tgtd listens beyond 127.0.0.1:$TGTD_PORT:" >&2
		ss -Hltnp | grep "pid=$TGTD_PID," >&2
		return 1
	fi
}

tgtd_target() { # tid iqn backing-file
	"$TGTADM" --lld iscsi --op new --mode target --tid "$1" -T "$2" &&
		"$TGTADM" --lld iscsi --op new --mode logicalunit --tid "$1" --lun 1 -b "$3" &&
		"$TGTADM" --lld iscsi --op bind --mode target --tid "$1" -I ALL
}

tgtd_stop() {
	[ -f "$PWD/tgtd/pid" ] || return 0
	local pid
	pid=$(cat "$PWD/tgtd/pid")
	kill -0 "$pid" 2>/dev/null || return 0
	for tid in $("$TGTADM" --lld iscsi --op show --mode target 2>/dev/null | sed -n 's/^Target \([0-9]*\):.*/\1/p'); do
		"$TGTADM" --lld iscsi --op delete --mode target --tid "$tid" --force >/dev/null 2>&1
	done
	"$TGTADM" --op delete --mode system >/dev/null 2>&1
	for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
}
