#!/bin/sh
# An NFS backup target: the guest kernel's nfsd serves a tmpfs (NFSv4 only, no rpcbind), and
# talon's backupstore (tests/vm.rs nfs_backup_client) mounts nfs://127.0.0.1:/srv/nfs/store
# itself, backs up in full and incrementally, restores, deletes, refuses a missing path and
# unmounts; the server's folder then holds the store's files.
# vm-timeout: 300
set -u
fail() { echo "nfs-backup: $*"; exit 1; }
modprobe nfsd || fail "modprobe nfsd"
modprobe nfsv4 || fail "modprobe nfsv4"
mkdir -p /srv/nfs /var/lib/nfs/v4recovery /etc /run/rpc_pipefs
mount -t tmpfs -o size=160m tmpfs /srv/nfs || fail "tmpfs"
mkdir -p /srv/nfs/store
grep -q ' /proc/fs/nfsd ' /proc/mounts || mount -t nfsd nfsd /proc/fs/nfsd || fail "mount nfsd"
touch /etc/exports /var/lib/nfs/etab /var/lib/nfs/rmtab
# short lease and grace: a new server refuses opens during its grace period
echo 10 >/proc/fs/nfsd/nfsv4leasetime
echo 10 >/proc/fs/nfsd/nfsv4gracetime
exportfs -o rw,fsid=1,no_root_squash,insecure,no_subtree_check,sync 127.0.0.1:/srv/nfs || fail "exportfs"
rpc.mountd -N 2 -N 3 -u || fail "rpc.mountd"
rpc.nfsd -N 3 -U -p 2049 4 || fail "rpc.nfsd"
echo "nfsd versions: $(cat /proc/fs/nfsd/versions), ports: $(cat /proc/fs/nfsd/portlist | tr '\n' ' ')"
TALON_NFS_TARGET=nfs://127.0.0.1:/srv/nfs/store "$TALON_HOST_NFS_CLIENT" --ignored --exact nfs_backup_client --nocapture >/tmp/nfs-client.log 2>&1
rc=$?
cat /tmp/nfs-client.log
[ $rc = 0 ] && grep -q '^NFS ok' /tmp/nfs-client.log || fail "the client failed (exit $rc)"
# what the server holds: backup-two's config and blocks, backup-one's config gone
cfgs=$(find /srv/nfs/store/backupstore -name 'backup_*.cfg' | sed 's,.*/,,' | sort | tr '\n' ' ')
blks=$(find /srv/nfs/store/backupstore -name '*.blk' | wc -l)
echo "server side: $cfgs; $blks blocks"
[ "$cfgs" = "backup_backup-two.cfg " ] || fail "the server holds $cfgs"
# backup-two maps 4 blocks, two of them equal (the client's pattern repeats): 3 objects
[ "$blks" = 3 ] || fail "the server holds $blks blocks"
grep -q ' nfs4 ' /proc/mounts && fail "an NFS mount is left: $(grep ' nfs4 ' /proc/mounts)"
rpc.nfsd 0
exportfs -ua
exit 0
