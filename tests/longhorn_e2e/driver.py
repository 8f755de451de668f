"""The scenarios of the end-to-end test with Longhorn's real control plane (tests/longhorn_e2e.rs).

one-node: one node, a block disk on a loop device registered through Longhorn's Node CR, a V2
  volume (1 replica, frontend nvmf) attached with a VolumeAttachment ticket, a pattern written
  and read back over its NVMe/TCP endpoint with spdk_dd, a snapshot, a volume cloned from it
  (`dataSource: snap://...`: the manager's SnapshotClone through talon) read back equal and
  deleted, detach, delete; then nothing of it left in SPDK or talon.
two-nodes: two nodes (two talon, two spdk_tgt), 2 replicas; talon and spdk_tgt of the node
  without the engine killed (-9) and the manager rebuilding its replica; online expansion;
  a revert to a snapshot in maintenance mode; a second snapshot whose CR is deleted (the
  manager's SnapshotRemove and SnapshotPurge through talon, its lvols gone on both nodes); the
  engine's node (engineNodeID) patched to node 2 and back, the volume healthy with both
  replicas RW throughout (the second engine the manager makes there takes no replica from the
  serving one) and a multipath host (SPDK's bdevperf, verify) writing through each move without
  an I/O error, then the same two moves again with talon of node 2 killed (-9) while the new
  engine is made, once as the new engine's node and once as the serving one's
  (TALON_E2E_CRASH=0 leaves them out); V2 live migration of a second, migratable (rwx) volume attached by a csi-attacher
  ticket on node 1: a second ticket for node 2 (a second engine and engine-frontend there over the
  same replicas, the data read through the new one), confirmed (node 1's ticket dropped: the old
  pair gone), then a migration back to node 1 rolled back (its ticket dropped: the new pair gone,
  node 2 serving), the serving engine keeping every replica RW throughout, node 1's talon killed
  (-9) in each start, as the serving and as the new engine's node (TALON_E2E_CRASH=0 leaves the
  kills out), then a migration whose new engine fails, given up (TALON_E2E_MIGRATE=0 leaves the
  migrations out); detach, delete, nothing left on either node.
both: after the first snapshot, an S3 backup target (the Rust test's S3 server in the hub
  namespace) that the manager finds available, and a backup of that snapshot that the manager
  takes through talon and records Completed; after the volume is deleted, a new volume restored
  from that backup by the manager through talon, read back (the Rust test also restores the
  backup through talon's own reader afterwards).

    driver.py --scenario one-node|two-nodes|scale|two-nodes+scale|moves --work DIR --longhorn DIR --cache DIR
              --spdk DIR --talon BIN --s3-endpoint URL

moves: two nodes, one volume of 2 replicas, N engine relocations to node 2 and back in turn with
  the writer (writer.py) through each, its steady IOPS before and after (issue 53's benchmark,
  benches/longhorn_move.rs; `--moves N --metrics FILE`).
two-nodes+scale: two-nodes, then the scale scenario (scale.py) on the same cluster, its disks
  sized for scale: one start of the control plane, the managers and the instance managers for
  both (CI time: a cluster's start and stop is a minute or more on a loaded machine).

Exit 0 when every step passed; else the failing step on stderr: its `FAILED:` line, then its
`why: ` lines (the volume's Longhorn objects one per line, the managers' and talon's last words
on it: what the Rust test's message and tests/summary.py repeat), then the logs' tails. One line
per step on stdout: `STEP <name> <seconds>`; one per writer run through a move or a migration step:
`WRITER <what>: runtime_s= iops= longest_io_ms=`.

By hand: TALON_E2E_HOLD=STEP:SECONDS holds the cluster after STEP (to look at it);
TALON_E2E_FAIL_AFTER=STEP fails after STEP (to see a failure's report, the logs kept);
TALON_E2E_OUTAGE=SECONDS is how long the killed node stays down (20); TALON_E2E_KEEP_LOGS=1 (read
by the Rust test) keeps a passed run's logs in target/tmp/longhorn-e2e/failed/<scenario>/ too
(driver.err's timestamped lines say where the time went).
"""

import argparse
import array
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback

import cluster as lh
from cluster import HOST_NQN, NS, wait_for
from writer import Writer

NODE = "e2e-node-1"
VOLUME = "e2e-vol-1"
RESTORED = "e2e-vol-1-restored"
CLONE = "e2e-vol-1-clone"
BACKUP = "e2e-backup-1"
BACKUP_2 = "e2e-backup-2"
DR = "e2e-vol-1-dr"
MIGRATE = "e2e-vol-mig"
# the Rust test's S3 server (s3s-fs): its bucket and credentials (tests/support/s3_server.rs)
S3_TARGET = "s3://backups@us-east-1/"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "talon-test", "AWS_SECRET_ACCESS_KEY": "talon-test-secret"}
NOISE = ("kernel module not loaded", "Longhorn asked for")
MIB = 1 << 20
# where the writer across an engine move writes (past the steps' 8 MiB patterns at 0, below
# the old end where the expansion's pattern sits)
WRITER_AT, WRITER_LEN = 64 * MIB, 32 * MIB
SIZE = 128 * MIB
GROUP, VERSION = "longhorn.io", "v1beta2"
T_MANAGER, T_STEP = 240, 120


def pattern(seed, n=8 * MIB):
    """Byte i: byte i % 4 (little-endian) of i * 2654435761, xor seed (the Rust test's check_backup
    computes it so). Built from the products' words at C speed (a generator over 8 Mi bytes took
    7-14 s of a loaded CI machine per call): byte k of word i = 4j + k is at 8i + k = 32j + 9k."""
    words = array.array("Q", range(0, n * 2654435761, 2654435761))
    if sys.byteorder != "little":
        words.byteswap()
    b = words.tobytes()
    out = bytearray(n)
    for k in range(4):
        out[k::4] = b[9 * k::32][:len(range(k, n, 4))]
    return bytes(out).translate(bytes(x ^ seed for x in range(256)))


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Scenario:
    def __init__(self, c, spdk_dir, nodes, replicas):
        self.c, self.spdk_dir, self.times = c, spdk_dir, []
        self.nodes, self.replicas = nodes, replicas
        self.im, self.dev = {}, {}
        self.vol = VOLUME  # the volume the steps act on
        # replica instances longhorn-manager made again after their Replica CR was deleted
        # (a peer race, reported by a PEER line): name -> lvol UUID, left out of nothing_left
        self.peer_left = {}

    def step(self, name, fn):
        say(f"step {name}")
        t0 = time.monotonic()
        r = fn()
        dt = time.monotonic() - t0
        self.times.append((name, dt))
        print(f"STEP {name} {dt:.1f}", flush=True)
        hold = os.environ.get("TALON_E2E_HOLD", "")  # STEP:SECONDS, to look at the cluster by hand
        if hold.partition(":")[0] == name:
            say(f"holding {hold.partition(':')[2]} s after {name} (work dir {self.c.work})")
            time.sleep(float(hold.partition(":")[2]))
        if os.environ.get("TALON_E2E_FAIL_AFTER") == name:  # to see a failure's report
            raise AssertionError(f"TALON_E2E_FAIL_AFTER={name}")
        return r

    # ---- Longhorn objects ------------------------------------------------------------------
    def get(self, plural, name):
        return self.c.custom.get_namespaced_custom_object(GROUP, VERSION, NS, plural, name)

    def list(self, plural, selector=None):
        return self.c.custom.list_namespaced_custom_object(GROUP, VERSION, NS, plural,
                                                           label_selector=selector or "")["items"]

    def patch(self, plural, name, body):
        return self.c.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, plural, name, body)

    def diag(self):
        """What the failure message carries: the manager's and talon's logs tail, the objects."""
        out = []
        for name in [n for n in self.c.procs if n.startswith("longhorn-manager-")]:
            out.append(f"--- {name} log tail ---\n{self.c.tail(name, 50, skip='level=debug')}")
        for name in [n for n in self.c.procs if n.startswith("talon-")]:
            out.append(f"--- {name} log tail ---\n{self.c.tail(name, 50, skip=NOISE)}")
        for plural in ["volumes", "engines", "enginefrontends", "replicas", "instancemanagers", "engineimages",
                       "backuptargets", "backups", "backupvolumes"]:
            try:
                items = self.list(plural)
            except Exception as e:  # noqa: BLE001
                items = [repr(e)]
            for it in items:
                st = it.get("status", {}) if isinstance(it, dict) else it
                spec = it.get("spec", {}) if isinstance(it, dict) and plural == "enginefrontends" else {}
                out.append(f"--- {plural} {it.get('metadata', {}).get('name') if isinstance(it, dict) else ''}: "
                           f"{json.dumps(st)[:1500]}" + (f" spec {json.dumps(spec)[:600]}" if spec else ""))
        if self.c.kubelet_error:
            out.append(f"--- stand-in kubelet: {self.c.kubelet_error}")
        return "\n".join(out)

    def why(self):
        """A failure's few lines that CI shows (`why: ` lines, repeated by tests/summary.py): one
        line per Longhorn object of the volume, then the manager's and talon's last words on it."""
        out = []

        def brief(plural, it, keys, spec_keys=()):
            st, sp = it.get("status", {}), it.get("spec", {})
            kv = [f"{k}={json.dumps(st.get(k), separators=(',', ':'))}" for k in keys if st.get(k) not in (None, "", {}, [])]
            kv += [f"spec.{k}={json.dumps(sp.get(k), separators=(',', ':'))}" for k in spec_keys
                   if sp.get(k) not in (None, "", {}, [], False)]
            out.append(f"{plural[:-1]} {it['metadata']['name']}: {' '.join(kv)}"[:600])

        sel = f"longhornvolume={self.vol}"
        try:
            brief("volumes", self.get("volumes", self.vol), ["state", "robustness", "currentNodeID"])
            for e in self.list("engines", sel):
                brief("engines", e, ["currentState", "replicaModeMap", "rebuildStatus"], ["replicaAddressMap"])
            for f in self.list("enginefrontends"):
                brief("enginefrontends", f, ["currentState", "targetIP", "targetPort"], ["engineName"])
            for r in self.list("replicas", sel):
                brief("replicas", r, ["currentState", "instanceManagerName", "ip", "port"],
                      ["nodeID", "desireState", "failedAt", "lastFailedAt", "healthyAt", "rebuildRetryCount"])
            for im in self.list("instancemanagers"):
                brief("instancemanagers", im, ["currentState"], ["nodeID"])
        except Exception as e:  # noqa: BLE001
            out.append(f"(the objects: {e!r})"[:300])
        words = ("ebuild", "eplica", self.vol)
        for name in sorted(self.c.procs):
            if name.startswith("longhorn-manager-"):
                pick = lambda l: ("level=warning" in l or "level=error" in l or "ebuild" in l) and \
                    "token_source" not in l and "Request (user:" not in l
            elif name.startswith("talon-"):
                pick = lambda l: any(w in l for w in words) and not any(x in l for x in NOISE)
            else:
                continue
            try:
                with open(self.c.logfile(name), errors="replace") as f:
                    lines = [l.rstrip() for l in f if pick(l)]
            except OSError:
                continue
            out += [f"{name}: {l[:300]}" for l in lines[-8:]]
        return out

    def wait(self, what, fn, timeout=T_STEP):
        def checked():
            self.c.manager_alive()
            return fn()

        return wait_for(what, checked, timeout, diag=self.diag)

    # ---- steps ---------------------------------------------------------------------------------
    def control_plane(self):
        c = self.c
        c.enter_netns()
        c.certs()
        c.start_control_plane()

    def crds(self):
        n = self.c.apply_crds()
        say(f"{n} CRDs established")

    def manager(self):
        """The managers one after the other: the first serves the webhooks (the Services'
        ClusterIPs are on its node)."""
        c = self.c
        c.bootstrap(self.nodes)
        c.start_kubelet()
        for n in self.nodes:
            c.start_iscsid(n)
            c.start_manager(n)
            self.wait(f"Longhorn Node CR of {n}", lambda n=n: self.get("nodes", n), T_MANAGER)

    def instance_manager(self):
        for n in self.nodes:
            def running(n=n):
                ims = [im for im in self.list("instancemanagers")
                       if im["spec"].get("dataEngine") == "v2" and im["spec"].get("nodeID") == n]
                return ims and ims[0].get("status", {}).get("currentState") == "running" and ims[0]

            im = self.wait(f"the V2 instance manager of {n} running (talon serving it)", running, T_MANAGER)
            self.im[n] = im["metadata"]["name"]
            say(f"instance manager {self.im[n]} at {im['status'].get('ip')}")

    def disk(self):
        """The block disks, registered on Longhorn's Node CRs as soon as they exist: the manager's
        disk monitor looks every 30 s, so this overlaps with the instance managers' start."""
        for n in self.nodes:
            self.dev[n] = self.c.loop_device(f"disk-{n}", getattr(self, "disk_bytes", 1024 * MIB))
            self.patch("nodes", n, {"spec": {"disks": {"disk-1": {
                "path": self.dev[n], "diskType": "block", "diskDriver": "aio", "allowScheduling": True,
                "evictionRequested": False, "storageReserved": 0, "tags": []}}}})

    def disk_ready(self):
        for n in self.nodes:
            def ready(n=n):
                ds = self.get("nodes", n).get("status", {}).get("diskStatus", {}).get("disk-1")
                if not ds:
                    return False
                conds = {x["type"]: x["status"] for x in ds.get("conditions", [])}
                return conds.get("Ready") == "True" and conds.get("Schedulable") == "True" and ds

            ds = self.wait(f"disk-1 of {n} ({self.dev[n]}) Ready and Schedulable", ready)
            say(f"{n} disk-1: {self.dev[n]}, uuid {ds.get('diskUUID')}, max {ds.get('storageMaximum')}")

    def volume(self, from_backup=None, standby=False):
        spec = {"size": str(SIZE), "numberOfReplicas": self.replicas, "dataEngine": "v2", "frontend": "nvmf",
                "accessMode": "rwo"}
        if from_backup:
            spec["fromBackup"] = from_backup
            spec["Standby"] = standby  # its JSON name in v1.12.1's Volume CRD
        self.c.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "volumes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Volume", "metadata": {"name": self.vol}, "spec": spec})
        if from_backup:
            return
        self.wait("volume detached (created)",
                  lambda: self.get("volumes", self.vol).get("status", {}).get("state") == "detached")

    def attach(self, maintenance=False):
        self.wait("the volume's VolumeAttachment", lambda: self.get("volumeattachments", self.vol))
        self.patch("volumeattachments", self.vol, {"spec": {"attachmentTickets": {"e2e": {
            "id": "e2e", "type": "longhorn-api", "nodeID": NODE,
            "parameters": {"disableFrontend": "true" if maintenance else "false"}}}}})
        self.wait_healthy("volume attached and healthy")
        if maintenance:
            return
        ep = self.wait("the engine's endpoint",
                       lambda: self.list("engines", f"longhornvolume={self.vol}")[0]["status"].get("endpoint"))
        say(f"engine endpoint {ep}")
        rest = ep.split("://", 1)[-1]
        hostport, _, nqn = rest.partition("/")
        self.addr, self.port = hostport.rsplit(":", 1)
        self.nqn = nqn

    def wait_healthy(self, what, timeout=T_STEP):
        def healthy():
            st = self.get("volumes", self.vol).get("status", {})
            reps = self.list("replicas", f"longhornvolume={self.vol}")
            running = [r for r in reps if r.get("status", {}).get("currentState") == "running"]
            # the manager's view of a replica that just failed lags: its Replica CR still says
            # running and the volume healthy for a moment, so a running replica failed (failedAt)
            # or not RW in the engine's mode map is not healthy yet (a rebuild wait passed at
            # once). A failed replica the manager replaced by a new one instead of reusing it
            # stays, stopped, with its failedAt (Longhorn keeps it for staleReplicaTimeout): the
            # running ones are what count, and they must be the engine's RW replicas.
            engines = self.list("engines", f"longhornvolume={self.vol}")
            modes = (engines[0].get("status", {}).get("replicaModeMap") or {}) if engines else {}
            names = {r["metadata"]["name"] for r in running}
            return (st.get("state") == "attached" and st.get("robustness") == "healthy"
                    and len(running) == self.replicas
                    and not any(r.get("spec", {}).get("failedAt") for r in running)
                    and set(modes) == names and all(m == "RW" for m in modes.values()))

        self.wait(what, healthy, timeout)

    def io(self, seed=0x5A):
        data = pattern(seed)
        self.dd(data)
        self.check(data, "the data read back over the volume's NVMe/TCP endpoint")
        return data

    def block_size(self):
        """The block size of the bdev the volume's subsystem exports, as its node's spdk_tgt says."""
        for n, pod in self.im.items():
            rpc = [sys.executable, f"{self.spdk_dir}/scripts/rpc.py", "-s", f"{self.c.work}/{pod}/run/spdk.sock"]
            for x in json.loads(lh.run(*rpc, "nvmf_get_subsystems").stdout):
                if x["nqn"] == self.nqn and x.get("namespaces"):
                    b = json.loads(lh.run(*rpc, "bdev_get_bdevs", "-b", x["namespaces"][0]["bdev_name"]).stdout)
                    return b[0]["block_size"]
        raise AssertionError(f"no node exports {self.nqn}")

    def check(self, data, what, offset=0):
        back = self.dd(None, len(data), offset)
        if back != data:
            raise AssertionError(f"{what} differs from what was written")

    def beyond_old_end(self):
        """Written and read back past the size before the expansion: the endpoint serves the new
        size."""
        data = pattern(0xC3)
        self.dd(data, offset=SIZE)
        self.check(data, f"the data at {SIZE} (past the size before the expansion)", SIZE)

    def dd(self, data, length=0, offset=0):
        w = self.c.work
        conf = f"{w}/dd.json"
        with open(conf, "w") as f:
            json.dump({"subsystems": [{"subsystem": "bdev", "config": [{
                "method": "bdev_nvme_attach_controller",
                "params": {"name": "dd", "trtype": "tcp", "adrfam": "ipv4", "traddr": self.addr,
                           "trsvcid": self.port, "subnqn": self.nqn, "hostnqn": HOST_NQN,
                           # a host that rides through a closed export as a kernel host does
                           # (connects again every second, I/O held meanwhile): spdk_dd never
                           # looks at an I/O's success, so a write or read failed by a moment's
                           # closure (a shared member moving back to its lvol after a relocation,
                           # issue 53) would pass unseen and read back as a mismatch
                           "reconnect_delay_sec": 1, "ctrlr_loss_timeout_sec": 30}}]}]}, f)
        argv = [f"{self.spdk_dir}/build/bin/spdk_dd", "--no-huge", "-s", "512", "--disable-cpumask-locks",
                "-c", "0x2", "-r", f"{w}/dd.sock", "--json", conf, "--bs", "65536"]
        f = f"{w}/dd.bin"
        if data is not None:
            with open(f, "wb") as out:
                out.write(data)
            argv += ["--if", f, "--ob", "ddn1", "--seek", str(offset // 65536)]
        else:
            if os.path.exists(f):
                os.remove(f)
            argv += ["--ib", "ddn1", "--of", f, "--count", str(length // 65536), "--skip", str(offset // 65536)]
        for attempt in range(1, 4):
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            # a connect the target dropped before spdk_dd copied anything (its FABRIC CONNECT
            # aborted, the bdev never made: seen once after a backup, nothing in the target's
            # log): connected again, as a kernel host reconnects; said, never hidden
            if r.returncode == 0 or "Failed to attach nvme ctrlr" not in r.stderr + r.stdout or attempt == 3:
                break
            say(f"spdk_dd could not connect to {self.addr}:{self.port} (try {attempt} of 3); again in 1 s")
            time.sleep(1)
        if r.returncode != 0:
            raise RuntimeError(f"spdk_dd: exit {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        if data is None:
            return open(f, "rb").read()
        return None

    def snapshot(self, name="e2e-snap-1"):
        self.c.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "snapshots", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Snapshot", "metadata": {"name": name},
            "spec": {"volume": self.vol, "createSnapshot": True}})
        st = self.wait(f"snapshot {name} readyToUse",
                       lambda: (s := self.get("snapshots", name).get("status", {})).get("readyToUse") and s)
        say(f"snapshot: {json.dumps(st)[:400]}")

    def snapshot_lvols(self, name):
        """The lvols of snapshot `name` on every node (`<replica>-snap-<name>`), as spdk_tgt lists them."""
        out = []
        for n, pod in self.im.items():
            sock = f"{self.c.work}/{pod}/run/spdk.sock"
            rpc = [sys.executable, f"{self.spdk_dir}/scripts/rpc.py", "-s", sock]
            lvols = json.loads(lh.run(*rpc, "bdev_lvol_get_lvols").stdout)
            out += [f"{n}: {x['alias']}" for x in lvols if x.get("alias", "").endswith(f"-snap-{name}")]
        return out

    def snapshot_delete(self, name="e2e-snap-2"):
        """A second snapshot, then its Snapshot CR deleted: the manager's snapshot controller calls
        talon's SnapshotRemove, SnapshotPurgeStatus and SnapshotPurge, and lets the CR go once
        SnapshotGet no longer finds it. Its lvols are then gone from every replica, the other node's
        through that node's ReplicaSnapshotDelete."""
        self.snapshot(name)
        made = self.snapshot_lvols(name)
        if len(made) != self.replicas:
            raise AssertionError(f"snapshot {name}: {len(made)} lvols for {self.replicas} replicas: {made}")
        self.c.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "snapshots", name)

        def gone():
            try:
                self.get("snapshots", name)
                return False
            except lh.ApiException as e:
                return e.status == 404

        self.wait(f"snapshot {name}'s CR deleted", gone)
        left = self.snapshot_lvols(name)
        if left:
            raise AssertionError(f"snapshot {name} deleted, its lvols left: {left}")
        say(f"snapshot {name} deleted: {made} gone")

    def backup_target(self):
        """Longhorn's default BackupTarget on the S3 server, its credentials in a Secret: the
        manager's backup target controller finds it available when the engine image's binary
        (talon, installed by the stand-in kubelet's engine image pod) answers `system-backup
        list` with those credentials."""
        host, port = self.s3.split("://", 1)[-1].rsplit(":", 1)
        wait_for("the S3 server in the hub namespace",
                 lambda: socket.create_connection((host, int(port)), timeout=2).close() or True, T_STEP)
        self.c.core.create_namespaced_secret(NS, {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "e2e-s3"},
            "stringData": {**S3_KEYS, "AWS_ENDPOINTS": self.s3}})
        self.wait("the engine image deployed",
                  lambda: any((ei.get("status") or {}).get("state") == "deployed"
                              for ei in self.list("engineimages")), T_MANAGER)
        self.patch("backuptargets", "default", {"spec": {
            "backupTargetURL": S3_TARGET, "credentialSecret": "e2e-s3", "pollInterval": "10s"}})
        self.wait("the backup target available",
                  lambda: (self.get("backuptargets", "default").get("status") or {}).get("available"), T_MANAGER)

    def backup(self, snap="e2e-snap-1", name=BACKUP):
        """A Backup CR of the snapshot: the manager's backup controller asks talon's proxy
        (SnapshotBackup, then SnapshotBackupStatus until complete), then reads the backup from
        the store through the engine binary (`backup inspect`) into the CR, and the backup
        volume controller lists it on the BackupVolume."""
        self.c.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "backups", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Backup",
            "metadata": {"name": name, "labels": {"backup-volume": VOLUME}},
            "spec": {"snapshotName": snap, "labels": {"e2e": "talon"}}})

        def completed():
            st = self.get("backups", name).get("status") or {}
            if st.get("state") == "Error":
                raise AssertionError(f"backup {name}: Error: {st.get('error') or st.get('messages')}")
            return st.get("state") == "Completed" and st.get("url") and st
        st = self.wait(f"backup {name} Completed", completed, T_MANAGER)
        say(f"backup: {json.dumps(st)[:600]}")
        if st.get("snapshotName") != snap or int(st.get("volumeSize") or 0) != SIZE:
            raise AssertionError(f"backup {name}: snapshot {st.get('snapshotName')}, "
                                 f"size {st.get('volumeSize')} (wanted {snap}, {SIZE})")
        bv = self.wait("the backup volume listing the backup",
                       lambda: next((b for b in self.list("backupvolumes")
                                     if (b.get("status") or {}).get("lastBackupName") == name), None),
                       T_MANAGER)
        say(f"backup volume: {json.dumps(bv.get('status'))[:400]}")

    def restore(self, first):
        """A volume made from the backup (`fromBackup`): the manager attaches it with its frontend
        disabled, asks talon's proxy BackupRestore (each replica restores the backup on its node),
        polls BackupRestoreStatus until every replica reports the backup restored, finishes the
        restore and detaches it. Attached again, it reads the backed-up snapshot's pattern, with
        zeros after it; then it is detached and deleted."""
        url = self.get("backups", BACKUP)["status"]["url"]
        self.vol = RESTORED
        try:
            self.volume(from_backup=url)

            def restored():
                st = self.get("volumes", RESTORED).get("status") or {}
                for c in st.get("conditions") or []:
                    if c.get("type") == "Restore" and c.get("reason") == "RestoreFailure":
                        raise AssertionError(f"volume {RESTORED}: restore failed: {c.get('message')}")
                return (st.get("restoreInitiated") and not st.get("restoreRequired")
                        and st.get("state") == "detached" and st)
            st = self.wait(f"volume {RESTORED} restored from {url} and detached", restored, T_MANAGER)
            engines = self.list("engines", f"longhornvolume={RESTORED}")
            last = engines[0].get("status", {}).get("lastRestoredBackup") if engines else None
            say(f"restored: {json.dumps(st)[:400]}; engine lastRestoredBackup {last}")
            self.attach()
            self.check(first, "the data of the volume restored from the backup")
            self.check(bytes(8 * MIB), "the restored volume after the backed-up data (zeros)", 8 * MIB)
            self.detach()
            self.delete()
        finally:
            self.vol = VOLUME

    def clone(self, first, snap="e2e-snap-1", linked=False):
        """A volume made from snapshot `snap` of the volume (`dataSource: snap://<vol>/<snap>`, what
        a PVC with a VolumeSnapshot dataSource becomes): the manager attaches both, calls talon's
        proxy SnapshotClone on the new volume's engine and polls SnapshotCloneStatus until it
        reports complete; the clone's state goes to completed. Attached, it reads the snapshot's
        pattern; then it is detached and deleted. The volume's endpoint is kept for the steps after.
        `linked`: Longhorn's fast clone (`cloneMode: linked-clone`): the manager places each new
        replica beside a source replica (`LinkedCloneSrcReplicaName`) and sends the pairs; talon
        links them, copying nothing (its log says so)."""
        name = CLONE + ("-linked" if linked else "")
        self.vol = name
        endpoint = (self.addr, self.port, self.nqn)
        try:
            spec = {"size": str(SIZE), "numberOfReplicas": self.replicas, "dataEngine": "v2",
                    "frontend": "nvmf", "accessMode": "rwo", "dataSource": f"snap://{VOLUME}/{snap}"}
            if linked:
                spec["cloneMode"] = "linked-clone"
            self.c.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "volumes", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Volume", "metadata": {"name": name},
                "spec": spec})

            def cloned():
                st = (self.get("volumes", name).get("status") or {}).get("cloneStatus") or {}
                if st.get("state") == "failed":
                    raise AssertionError(f"volume {name}: the clone failed: {json.dumps(st)}")
                return st.get("state") == "completed" and st
            st = self.wait(f"volume {name} cloned from {VOLUME}/{snap}", cloned, T_MANAGER)
            say(f"cloned: {json.dumps(st)[:400]}")
            # which way talon copied it (a snapshot of this node: shallow copies inside spdk_tgt)
            ways = []
            for proc in sorted(self.c.procs):
                if proc.startswith("talon-"):
                    try:
                        with open(self.c.logfile(proc), errors="replace") as f:
                            ways += [l.strip()[:300] for l in f if "cloned a snapshot" in l and name in l]
                    except OSError:
                        pass
            for w in ways:
                say(w)
            if linked:
                assert any("cloned a snapshot: linked" in w for w in ways), \
                    f"volume {name}: talon linked no replica (its log: {ways})"
                for r in self.list("replicas"):
                    if (r.get("spec") or {}).get("volumeName") == name:
                        src = (r.get("spec") or {}).get("linkedCloneSrcReplicaName")
                        assert src, f"replica {r['metadata']['name']}: no linkedCloneSrcReplicaName"
                        say(f"replica {r['metadata']['name']} linked to {src}")
            self.attach()
            self.check(first, f"the data of the volume cloned from {snap}")
            if linked and self.replicas > 1:
                self.clone_replica_rebuilt(name, first, snap)
            self.detach()
            self.delete()
        finally:
            self.vol = VOLUME
            self.addr, self.port, self.nqn = endpoint

    def clone_replica_rebuilt(self, name, first, snap):
        """A linked clone's replica on the second node lost (its Replica CR deleted while the
        clone is attached): the manager makes a new one beside a source replica
        (`linkedCloneSrcReplicaName`) and ReplicaAdds it with that replica as its
        `linked_clone_source`; talon rebuilds it thin over the entrypoint beside it (its log says
        so), copying only the clone's own data. The clone reads the snapshot's pattern after."""
        lost = [r for r in self.list("replicas", f"longhornvolume={name}")
                if (r.get("spec") or {}).get("nodeID") != NODE]
        assert lost, f"volume {name}: no replica on another node than {NODE}"
        old = lost[0]["metadata"]["name"]
        say(f"deleting replica {old} of the linked clone {name}")
        self.c.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "replicas", old)
        self.wait(f"replica {old} gone", lambda: old not in {
            r["metadata"]["name"] for r in self.list("replicas", f"longhornvolume={name}")}, T_MANAGER)
        self.rebuilt()
        self.instance_gone(old)
        new = [r for r in self.list("replicas", f"longhornvolume={name}")
               if r["metadata"]["name"] != old and (r.get("spec") or {}).get("nodeID") != NODE]
        assert new, f"volume {name}: no new replica on the second node"
        new_name = new[0]["metadata"]["name"]
        src = (new[0].get("spec") or {}).get("linkedCloneSrcReplicaName")
        assert src, f"replica {new_name}: no linkedCloneSrcReplicaName"
        thin = []
        for proc in sorted(self.c.procs):
            if proc.startswith("talon-"):
                try:
                    with open(self.c.logfile(proc), errors="replace") as f:
                        thin += [l.strip()[:400] for l in f
                                 if "rebuilding a linked clone's replica thin" in l and new_name in l]
                except OSError:
                    pass
        for t in thin[:3]:
            say(t)
        assert any(f"{src}-clone-ep-{snap}" in t for t in thin), \
            f"replica {new_name}: not rebuilt thin over {src}'s entrypoint (talon's log: {thin[:3]})"
        say(f"replica {new_name} rebuilt over {src}-clone-ep-{snap}")
        self.check(first, f"the data of the linked clone after its replica {new_name} was rebuilt")

    def instance_gone(self, replica, timeout=30):
        """Waits until no instance manager lists replica `replica`, whose CR was deleted. One
        longhorn-manager v1.12.1 made again after the delete (its volume controller reuses the
        replica it marks failed while the replica controller deletes it, and v1.12.1 makes no
        orphan for a V2 replica instance, so nothing deletes it later) is a peer race: a PEER
        line says so, and nothing_left does not count that replica's instance, export and lvol
        as talon's leftovers. Made again by anyone else, or left without the manager's create:
        the step fails."""
        def listed():
            return {pod: inst for pod in self.im.values()
                    for r, inst in (self.get("instancemanagers", pod).get("status", {})
                                    .get("instanceReplicas") or {}).items() if r == replica}
        try:
            self.wait(f"replica instance {replica} gone", lambda: not listed(), timeout)
            return
        except TimeoutError:
            pass
        made_again = []
        for proc in sorted(self.c.procs):
            if proc.startswith("longhorn-manager"):
                with open(self.c.logfile(proc), errors="replace") as f:
                    made_again += [l for l in f if f"Creating instance {replica}" in l]
        if len(made_again) < 2:
            raise AssertionError(f"replica {replica}: its instance is still listed after its CR was "
                                 f"deleted, and longhorn-manager did not make it again: {listed()}")
        uuid = next(iter(listed().values()), {}).get("status", {}).get("uuid", "")
        self.peer_left[replica] = uuid
        print(f"PEER longhorn-manager v1.12.1 made replica instance {replica} again after its Replica CR "
              f"was deleted (the volume controller reused the replica it had marked failed; no orphan is "
              f"made for a V2 replica instance): left running, not counted as talon's", flush=True)

    def dr_restored(self, backup):
        """Waits until the DR volume's engine reports `backup` restored by every replica (the
        manager's engine monitor reads talon's BackupRestoreStatus), the volume still standby."""
        def done():
            st = self.get("volumes", DR).get("status") or {}
            for c in st.get("conditions") or []:
                if c.get("type") == "Restore" and c.get("reason") == "RestoreFailure":
                    raise AssertionError(f"volume {DR}: restore failed: {c.get('message')}")
            engines = self.list("engines", f"longhornvolume={DR}")
            last = engines[0].get("status", {}).get("lastRestoredBackup") if engines else None
            return st.get("isStandby") and last == backup and st
        st = self.wait(f"DR volume {DR} standby with {backup} restored", done, T_MANAGER)
        say(f"DR volume: {json.dumps(st)[:400]}")

    def dr_create(self):
        """A DR (standby) volume of the backup volume, from its first backup: the manager attaches
        it with its frontend disabled and asks talon's proxy BackupRestore; each replica restores
        the backup in full."""
        url = self.get("backups", BACKUP)["status"]["url"]
        self.vol = DR
        try:
            self.volume(from_backup=url, standby=True)
            self.dr_restored(BACKUP)
        finally:
            self.vol = VOLUME

    def dr_follow(self):
        """The source's second backup, found by the manager's backup volume poll (10 s), becomes
        the DR engine's requested restore: talon's replicas restore it incrementally (only the
        changed blocks fetched) from the one they hold."""
        self.dr_restored(BACKUP_2)

    def dr_activate(self, data):
        """The DR volume activated (standby off, frontend nvmf: the manager's REST `activate` takes
        blockdev or iscsi only, which need a kernel initiator this host lacks, so the Volume's spec
        is patched as that action patches it): the manager finishes the restore and detaches it;
        attached, it reads the source's second pattern; then it is detached and deleted."""
        self.vol = DR
        try:
            self.patch("volumes", DR, {"spec": {"Standby": False, "frontend": "nvmf"}})

            def active():
                st = self.get("volumes", DR).get("status") or {}
                return (not st.get("isStandby") and not st.get("restoreRequired")
                        and st.get("state") == "detached" and st)
            st = self.wait(f"DR volume {DR} activated and detached", active, T_MANAGER)
            say(f"activated: {json.dumps(st)[:400]}")
            self.attach()
            self.check(data, "the data of the activated DR volume (the source's second backup)")
            self.detach()
            self.delete()
        finally:
            self.vol = VOLUME

    def hash_cron(self):
        """The integrity check's cron made every 5 s (`@every 5s`: the manager's cron parser,
        robfig/cron's ParseStandard, takes descriptors; a minute's field would cost a wait of up to
        60 s per check); its value before (snapshot_hash puts it back)."""
        cron = "snapshot-data-integrity-cronjob"
        before = self.get("settings", cron)["value"]
        self.patch("settings", cron, {"value": json.dumps({"v1": "0 0 */7 * *", "v2": "@every 5s"})})
        return before

    def snapshot_hash(self, name="e2e-snap-1", before=None):
        """The manager's snapshot data integrity check (V2 default `fast-check`) on its cron, made
        every 5 s here (by hash_cron, `before` its value then, or now): it hashes the snapshot
        on both replicas (SnapshotHash, then SnapshotHashStatus every 5 s), votes, and writes the
        checksum on the Snapshot CR; a replica whose checksum lost the vote would be reported
        corrupted in its log."""
        cron = "snapshot-data-integrity-cronjob"
        if before is None:
            before = self.hash_cron()
        try:
            st = self.wait(f"the checksum of snapshot {name} on its Snapshot CR",
                           lambda: (s := self.get("snapshots", name).get("status", {})).get("checksum") and s,
                           150)
        finally:
            self.patch("settings", cron, {"value": before})
        say(f"snapshot {name} checksum {st['checksum']} at {st.get('checksumCalculatedAt')}")
        for node in self.nodes:
            with open(self.c.logfile(f"longhorn-manager-{node}")) as f:
                bad = [l for l in f if "Detected corrupted replica" in l or "Failed to check the data integrity" in l]
            if bad:
                raise AssertionError(f"the manager on {node} found the replicas' checksums differ: {bad[:3]}")

    def corrupt_replica(self, node, data, name="e2e-snap-1"):
        """Bit rot in snapshot `name` of `node`'s replica: a 4 KiB block of `data` (what the
        snapshot holds) found in that node's disk image and inverted there, under spdk_tgt. With
        the volume's data integrity `enabled` and the check's cron every 5 s, the manager
        hashes the snapshot again on both replicas; the checksums differ one to one and the
        checksum recorded before decides: it reports `node`'s replica corrupted and sets it ERR
        (`ReplicaModeUpdate`). talon takes it out of the raid1 at once; the manager fails it and
        rebuilds it (its snapshots are not trusted: a ReplicaAdd of it deletes them first), and
        the revert to this snapshot later reads `data` back through both replicas."""
        img = f"{self.c.work}/disk-{node}.img"
        block = data[:4096]
        at = None
        with open(img, "r+b") as f:
            fd = f.fileno()
            size = os.fstat(fd).st_size
            pos = 0
            while at is None and pos < size:
                try:
                    start = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError:
                    break
                end = os.lseek(fd, start, os.SEEK_HOLE)
                # the block lies 4 KiB-aligned: aligned reads never split it
                off = start - start % 4096
                while at is None and off < end:
                    f.seek(off)
                    chunk = f.read(min(4 * MIB, end - off))
                    at = next((off + k for k in range(0, len(chunk), 4096) if chunk[k:k + 4096] == block), None)
                    off += max(len(chunk), 4096)
                pos = end
            if at is None:
                raise AssertionError(f"the first block of {name}'s data is nowhere on {node}'s disk ({img})")
            f.seek(at)
            f.write(bytes(b ^ 0xFF for b in block))
            f.flush()
            os.fsync(fd)
        say(f"{name}'s first block inverted on {node}'s disk at byte {at}")
        reps = {r["metadata"]["name"] for r in self.list("replicas", f"longhornvolume={self.vol}")
                if r["spec"].get("nodeID") == node}
        cron = "snapshot-data-integrity-cronjob"
        before = self.hash_cron()
        self.patch("volumes", self.vol, {"spec": {"snapshotDataIntegrity": "enabled"}})
        try:
            def reported():
                with open(self.c.logfile(f"longhorn-manager-{NODE}")) as f:
                    return any("Detected corrupted replica" in l for l in f)
            self.wait("the manager's hash of the snapshot again: the replica on the node reported corrupted",
                      reported, 180)
            failed = self.wait(f"the replica on {node} failed (set ERR, out of the engine)",
                               lambda: [r["metadata"]["name"] for r in self.list("replicas", f"longhornvolume={self.vol}")
                                        if r["metadata"]["name"] in reps and r["spec"].get("failedAt")], 120)
            say(f"replica {failed} failed after the vote")
        finally:
            self.patch("volumes", self.vol, {"spec": {"snapshotDataIntegrity": "ignored"}})
            self.patch("settings", cron, {"value": before})
        self.wait_healthy("the corrupted replica rebuilt: the volume healthy again", 420)

    def detach(self):
        self.patch("volumeattachments", self.vol, {"spec": {"attachmentTickets": {"e2e": None}}})
        seen = []

        def detached():
            # what holds the volume attached, told if it never detaches
            va = self.get("volumeattachments", self.vol)
            v = self.get("volumes", self.vol)
            now = (sorted((va.get("spec", {}).get("attachmentTickets") or {}).keys()),
                   v.get("spec", {}).get("nodeID"), v.get("status", {}).get("state"))
            if not seen or seen[-1] != now:
                seen.append(now)
            return now[2] == "detached"

        try:
            self.wait("volume detached", detached)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n(attachment tickets, spec.nodeID, state) seen: {seen}") from e

    def delete(self):
        self.c.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "volumes", self.vol)

        def gone():
            try:
                self.get("volumes", self.vol)
                return False
            except lh.ApiException as e:
                return e.status == 404 and not self.list("replicas", f"longhornvolume={self.vol}") \
                    and not self.list("engines", f"longhornvolume={self.vol}")

        self.wait("volume, engine and replicas deleted", gone)

    def nothing_left(self):
        left, seen = [], {}

        def leftovers():
            out = []
            for n, pod in self.im.items():
                sock = f"{self.c.work}/{pod}/run/spdk.sock"
                rpc = [sys.executable, f"{self.spdk_dir}/scripts/rpc.py", "-s", sock]
                bdevs = json.loads(lh.run(*rpc, "bdev_get_bdevs").stdout)
                subs = json.loads(lh.run(*rpc, "nvmf_get_subsystems").stdout)
                out += [f"{n}: bdev {b['name']}" for b in bdevs
                        if (b.get("product_name") != "AIO disk"
                            and any(v in json.dumps(b) for v in (VOLUME, MIGRATE)))
                        or b.get("product_name") in ("Raid Volume", "NVMe disk")]
                out += [f"{n}: subsystem {x['nqn']}" for x in subs if x.get("subtype") != "Discovery"]
                seen[n] = ([f"{b['name']} ({b.get('product_name')})" for b in bdevs], [x["nqn"] for x in subs])
                im = self.get("instancemanagers", pod).get("status", {})
                for k in ["instanceEngines", "instanceReplicas", "instanceEngineFrontends", "instances"]:
                    out += [f"{n}: {k}/{x}" for x in (im.get(k) or {})]
            # what a peer race left (instance_gone's PEER line)
            return [x for x in out
                    if not any(r in x or (u and u in x) for r, u in self.peer_left.items())]

        def empty():
            nonlocal left
            left = leftovers()
            return not left

        try:
            self.wait("nothing of the volume left in SPDK and talon", empty, 60)
        except TimeoutError as e:
            raise AssertionError(f"left behind: {left}") from e
        say(f"SPDK after the delete (bdevs, subsystems): {seen}")

    # ---- two nodes -----------------------------------------------------------------------------
    def kill_node(self, node, outage=20):
        """kill -9 of talon and spdk_tgt of `node`'s instance manager, which the stand-in kubelet
        starts again only `outage` s later (a node down for a while); a pattern written through
        the engine meanwhile fails the replica there, and the manager must rebuild it."""
        pod = self.im[node]
        run_dir = f"{self.c.work}/{pod}/run"
        with self.c.lock:
            st = self.c.pods[f"{NS}/{pod}"]
        st["hold_until"] = time.monotonic() + outage
        pids = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if run_dir in cmd and ("spdk_tgt" in cmd or "talon" in cmd):
                    pids.append(int(d))
        say(f"kill -9 {pids} (talon and spdk_tgt of {pod}), back in {outage} s")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        data = self.io(0x3C)
        say(f"written and read back through the engine with {node} down in {time.monotonic() - t0:.1f} s")

        def failed():
            st = self.get("volumes", self.vol).get("status", {})
            reps = self.list("replicas", f"longhornvolume={self.vol}")
            return st.get("robustness") == "degraded" or any(
                r.get("spec", {}).get("failedAt") for r in reps)

        self.wait("the replica on the killed node failed (volume degraded)", failed, 90)
        return data

    def relocate(self, node, data, crash=None):
        """Engine relocation (issue 53): engineNodeID patched to `node` while attached; the manager
        makes a second engine there and switches the engine-frontend over in three phases
        (InstanceSwitchOverTarget preparing, switching, promoting), then deletes the old engine.
        A multipath host writes and verifies throughout (writer.py), in a region of the volume the
        steps' data does not use, the new engine's export added as a second path as soon as the
        manager's engine CR shows it (as a host's `nvme connect` would).
        Expected: the switch-over state back to "" with one engine, on `node`; the same
        engine-frontend object (same uid), its target the new engine and its active path an
        optimized path to it; no FailedSwitchover event; the volume never left attached; no I/O
        of the writer failed or read back different; the snapshots listed by the new engine with
        their creation times; `data` reads back through the new engine's export.
        `crash` = (node, phase): talon of that node killed (-9) once the move reaches `phase`
        (the volume's switchoverState), started again 10 s later by the stand-in kubelet; its
        spdk_tgt keeps serving. The move must still end as above (a failed phase is retried;
        FailedSwitchover events are then expected and said), the writer never failing."""
        writer = Writer(self.spdk_dir, self.c.work, HOST_NQN, self.block_size(), WRITER_AT, WRITER_LEN)
        writer.start(self.addr, self.port, self.nqn)
        try:
            return self.relocate_with(node, data, writer, crash)
        finally:
            writer.kill()

    def relocate_cancel(self, node, back, data):
        """A relocation taken back (issue 53): engineNodeID patched to `node`, and back to `back`
        in the same look that finds the manager's new engine CR on `node` (before the
        engine-frontend is pointed at it). The manager then sees engineNodeID equal to the current
        engine's node with two engines and removes the extra one ("Removing extra engine ...",
        processEngineSwitchover's cleanup). Expected: the new engine gone, from the cluster and from
        `node`'s spdk_tgt (no raid1 of it); the old engine serving on `back`; the switch-over state
        empty; the same engine-frontend targeting the old engine; the volume attached and healthy;
        a host writing and verifying throughout with no failed I/O; `back`'s engine on its local
        replica directly again (the new engine had it share it); `data` reads back."""
        sel = f"longhornvolume={self.vol}"
        ef_uid, first = self.one_frontend()
        attached, seen = self.attached_watch("the move taken back")

        with self.writing(f"a move to {node} taken back") as writer:
            self.patch("volumes", self.vol, {"spec": {"engineNodeID": node}})

            def made():
                attached()
                new = [e for e in self.list("engines", sel)
                       if e["metadata"]["name"] not in first and e["spec"].get("nodeID") == node]
                if not new:
                    return None
                self.patch("volumes", self.vol, {"spec": {"engineNodeID": back}})
                ef = self.list("enginefrontends", sel)[0]
                return new[0]["metadata"]["name"], ef["spec"].get("engineName"), \
                    (new[0].get("status") or {}).get("currentState")

            new, ef_engine, new_state = self.wait(f"the manager's new engine on {node}", made, 120)
            say(f"the new engine {new} on {node} ({new_state or 'no state yet'}): engineNodeID set back "
                f"to {back}; the engine-frontend then targeted {ef_engine}")
            if ef_engine not in first:
                raise AssertionError(f"the engine-frontend already targeted the new engine ({ef_engine}) "
                                     f"when the move was taken back")

            self.back_on(first, ef_uid, back, node, {new}, attached, "the move taken back")
            direct_s = self.direct_again(back)
        r = writer.result
        say(f"move to {node} taken back: switch-over states {seen['switchoverState']}, the writer "
            f"{r['iops']:.0f} IOPS, longest I/O {r['max_latency_us'] / 1000:.1f} ms, direct again after "
            f"{direct_s:.1f} s")
        self.check(data, f"the data after the move to {node} taken back")

    def one_frontend(self):
        """(uid of the volume's one engine-frontend, its engines' names sorted) before a move."""
        sel = f"longhornvolume={self.vol}"
        efs = self.list("enginefrontends", sel)
        if len(efs) != 1:
            raise AssertionError(f"one engine-frontend expected before the move, not {len(efs)}")
        return efs[0]["metadata"]["uid"], sorted(e["metadata"]["name"] for e in self.list("engines", sel))

    def attached_watch(self, what):
        """(attached, seen): attached() reads the volume's status, fails `what` when the volume
        left attached, notes each switch-over state it saw in seen["switchoverState"]."""
        seen = {"switchoverState": []}

        def attached():
            st = self.get("volumes", self.vol).get("status", {})
            if (st.get("switchoverState") or "") not in seen["switchoverState"]:
                seen["switchoverState"].append(st.get("switchoverState") or "")
            if st.get("state") != "attached":
                raise AssertionError(f"the volume left attached during {what}: {st.get('state')}; seen {seen}")
            return st

        return attached, seen

    def back_on(self, first, ef_uid, back, node, made, attached, what):
        """After a move that did not happen (`what`): only the engines `first` left, the
        switch-over state empty, the same engine-frontend (`ef_uid`) targeting the old engine,
        healthy on `back`, no raid1 of the engines `made` left on `node`'s spdk_tgt."""
        sel = f"longhornvolume={self.vol}"

        def only_first():
            st = attached()
            engines = sorted(e["metadata"]["name"] for e in self.list("engines", sel))
            return not st.get("switchoverState") and engines == first

        self.wait(f"{what}: only {first} left, switch-over state empty", only_first, 300)
        ef = self.list("enginefrontends", sel)[0]
        old = self.list("engines", sel)[0]
        want = f"{old['status'].get('storageIP')}:{old['status'].get('port')}"
        fs = ef.get("status", {})
        if ef["metadata"]["uid"] != ef_uid or ef["spec"].get("engineName") != first[0] \
                or f"{fs.get('targetIP')}:{fs.get('targetPort')}" != want:
            raise AssertionError(f"the engine-frontend after {what}: spec {ef['spec'].get('engineName')}, "
                                 f"target {fs.get('targetIP')}:{fs.get('targetPort')} (want {first[0]} at "
                                 f"{want}, the same object)")
        self.wait_healthy(f"healthy with the engine on {back} after {what}")
        pod = self.im[node]
        rpc = [sys.executable, f"{self.spdk_dir}/scripts/rpc.py", "-s", f"{self.c.work}/{pod}/run/spdk.sock"]
        self.wait(f"{node}'s spdk_tgt without a raid1 of {sorted(made)}",
                  lambda: not set(made) & {r["name"] for r in json.loads(lh.run(*rpc, "bdev_raid_get_bdevs",
                                                                                   "all").stdout)}, 60)

    def fault(self, node, name, on, only=None):
        """Turns talon fault `name` of `node` on or off (`TALON_FAULTS`, src/util/failpoint.rs):
        on while its file exists; `only`: for the objects whose names start so (a fault that
        reads its file's lines)."""
        d = f"{self.c.work}/{self.im[node]}/faults"
        os.makedirs(d, exist_ok=True)
        if on:
            with open(f"{d}/{name}", "w") as f:
                f.write(f"{only}\n" if only else "")
        elif os.path.exists(f"{d}/{name}"):
            os.remove(f"{d}/{name}")
        say(f"talon fault {name} of {node} {'on' if on else 'off'}")

    def listener_ana(self, node):
        """The ANA states of `node`'s listeners of the volume's subsystem, as its spdk_tgt has them."""
        pod = self.im[node]
        rpc = [sys.executable, f"{self.spdk_dir}/scripts/rpc.py", "-s", f"{self.c.work}/{pod}/run/spdk.sock"]
        r = lh.run(*rpc, "nvmf_subsystem_get_listeners", self.nqn, check=False)
        if r.returncode != 0:
            return []
        return sorted({a["ana_state"] for ls in json.loads(r.stdout) for a in ls.get("ana_states") or []})

    def relocate_reverted(self, node, back, data):
        """A relocation longhorn-manager reverts on its own (issue 53): engineNodeID patched to
        `node` with `back`'s talon refusing the `promoting` phase (fault
        longhorn-switch-promoting), so the switch-over holds after `switching`: `back`'s engine
        inaccessible, the new engine on `node` the host's only path (non-optimized). Then
        `node`'s talon reports its engines in error (fault longhorn-engine-error): the manager
        reverts (deletes the new engine, points the engine-frontend's spec back) and calls
        nothing more on the frontend; it keeps making new engines on `node`, each in error,
        each reverted. Expected: `back`'s engine optimized again (talon's watch of the
        switch-over's new engine), the host's I/O going on with none failed. Then engineNodeID
        set back to `back` and the faults off: one engine, the old one, on `back`; the
        switch-over state empty; the same engine-frontend targeting it; healthy; no raid1 of a
        new engine left on `node`; `back`'s engine on its local replica directly again; `data`
        reads back."""
        sel = f"longhornvolume={self.vol}"
        ef_uid, first = self.one_frontend()
        attached, seen = self.attached_watch("the reverted move")
        made = set()

        with self.writing(f"a move to {node} the manager reverts") as writer:
            try:
                self.fault(back, "longhorn-switch-promoting", True)
                t0 = time.monotonic()
                self.patch("volumes", self.vol, {"spec": {"engineNodeID": node}})

                def held():
                    attached()
                    new = None
                    for e in self.list("engines", sel):
                        es = e.get("status") or {}
                        if e["metadata"]["name"] in first or e["spec"].get("nodeID") != node:
                            continue
                        new = e["metadata"]["name"]
                        made.add(new)
                        if es.get("currentState") == "running" and es.get("storageIP") and es.get("port"):
                            writer.add_path(es["storageIP"], es["port"])
                    ef = self.list("enginefrontends", sel)[0]
                    phase = (ef.get("status") or {}).get("switchoverPhase") or ""
                    return new if new and phase == "switching" else None

                new = self.wait(f"the switch-over to {node} held after switching ({back} refuses promoting)",
                                held, 180)
                held_ana = self.listener_ana(back)
                say(f"the switch-over to {new} on {node} held after switching ({time.monotonic() - t0:.1f} s): "
                    f"{back}'s listener {held_ana}")
                if held_ana != ["inaccessible"]:
                    raise AssertionError(f"{back}'s engine after switching: {held_ana}, not inaccessible")
                self.fault(node, "longhorn-engine-error", True)
                t1 = time.monotonic()

                def reverted():
                    st = attached()
                    names = {e["metadata"]["name"] for e in self.list("engines", sel)}
                    return new not in names and st

                self.wait(f"the manager's revert: {new} deleted", reverted, 180)
                reverted_s = time.monotonic() - t1
                self.wait(f"{back}'s engine optimized again after the revert",
                          lambda: attached() and self.listener_ana(back) == ["optimized"], 60)
                optimized_s = time.monotonic() - t1
                say(f"the manager reverted the move {reverted_s:.1f} s after {new} went in error; "
                    f"{back}'s engine optimized again {optimized_s:.1f} s after it")
                # the manager goes on making engines on `node`, each in error and reverted; the
                # old engine keeps serving optimized meanwhile
                t2 = time.monotonic()
                while time.monotonic() - t2 < 8:
                    attached()
                    for e in self.list("engines", sel):
                        if e["metadata"]["name"] not in first:
                            made.add(e["metadata"]["name"])
                    # a moment without the listener is the move of its member back to its lvol
                    # (the export closed ~300 ms, hosts reconnect): read again for up to 3 s
                    ana = self.listener_ana(back)
                    t3 = time.monotonic()
                    while ana != ["optimized"] and time.monotonic() - t3 < 3:
                        time.sleep(0.2)
                        ana = self.listener_ana(back)
                    if ana != ["optimized"]:
                        raise AssertionError(f"{back}'s engine no longer optimized while the manager "
                                             f"retried the move: {ana} for 3 s")
                    time.sleep(1)
                self.patch("volumes", self.vol, {"spec": {"engineNodeID": back}})
            finally:
                self.fault(node, "longhorn-engine-error", False)
                self.fault(back, "longhorn-switch-promoting", False)

            self.back_on(first, ef_uid, back, node, made, attached, "the reverted move")
            if self.listener_ana(back) != ["optimized"]:
                raise AssertionError(f"{back}'s engine after the reverted move: {self.listener_ana(back)}")
            direct_s = self.direct_again(back)
        r = writer.result
        say(f"move to {node} reverted by the manager: switch-over states {seen['switchoverState']}, engines "
            f"made on {node} {sorted(made)}, the writer {r['iops']:.0f} IOPS, longest I/O "
            f"{r['max_latency_us'] / 1000:.1f} ms, direct again after {direct_s:.1f} s")
        print(f"REVERTED the move to {node}: reverted_s={reverted_s:.1f} optimized_again_s={optimized_s:.1f} "
              f"longest_io_ms={r['max_latency_us'] / 1000:.1f}", flush=True)
        self.check(data, f"the data after the move to {node} the manager reverted")

    def direct_again(self, node):
        """Waits until `node`'s engine reaches its local replicas directly again, not through a
        loopback attach of their exports (held for the node's replicaShareHoldSecs after the
        last other engine asked for them): no NVMe bdev controller of `node`'s spdk_tgt connects
        to `node`'s own address. Returns the seconds waited."""
        pod = self.im[node]
        ip = self.get("instancemanagers", pod)["status"]["ip"]
        rpc = [sys.executable, f"{self.spdk_dir}/scripts/rpc.py", "-s", f"{self.c.work}/{pod}/run/spdk.sock"]
        t0 = time.monotonic()

        def direct():
            ctrls = json.loads(lh.run(*rpc, "bdev_nvme_get_controllers").stdout)
            return not [c["name"] for c in ctrls for p in c.get("ctrlrs") or []
                        if (p.get("trid") or {}).get("traddr") == ip]

        self.wait(f"{node}'s engine on its local replica directly (no loopback attach)", direct, 120)
        say(f"{node}'s engine on its local replica directly again after {time.monotonic() - t0:.1f} s")
        return time.monotonic() - t0

    @contextlib.contextmanager
    def writing(self, what):
        """The writer (writer.py) on the volume's current endpoint while the block runs; fails
        the step when one of its I/Os failed or read back different; its result in
        `writer.result` after the block."""
        writer = Writer(self.spdk_dir, self.c.work, HOST_NQN, self.block_size(), WRITER_AT, WRITER_LEN)
        writer.start(self.addr, self.port, self.nqn)
        try:
            yield writer
            r = writer.result = writer.stop()
        finally:
            writer.kill()
        say(f"the writer through {what}: {r['runtime']:.1f} s, {r['iops']:.0f} IOPS of 4 KiB verified, 0 failed, "
            f"the longest I/O {r['max_latency_us'] / 1000:.1f} ms")
        print(f"WRITER {what}: runtime_s={r['runtime']:.1f} iops={r['iops']:.0f} "
              f"longest_io_ms={r['max_latency_us'] / 1000:.1f}", flush=True)

    def steady(self, seconds):
        """The writer of the moves for `seconds` with nothing moving: the volume's steady IOPS."""
        with self.writing("nothing moving") as writer:
            time.sleep(seconds)
        return writer.result

    def kill_talon(self, node, outage):
        """kill -9 of `node`'s talon alone (its spdk_tgt serves on); the stand-in kubelet starts
        it again `outage` s later."""
        pod = self.im[node]
        with self.c.lock:
            self.c.pods[f"{NS}/{pod}"]["hold_until"] = time.monotonic() + outage
        run_dir = f"{self.c.work}/{pod}/run"
        pids = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                cmd = b" ".join(argv).decode(errors="replace")
                if run_dir in cmd and argv[0].decode(errors="replace").endswith("/talon") and " serve" in cmd:
                    pids.append(int(d))
        if not pids:
            raise AssertionError(f"no talon of {pod} to kill")
        say(f"kill -9 {pids} (talon of {pod} alone), back in {outage} s")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    def relocate_with(self, node, data, writer, crash):
        sel = f"longhornvolume={self.vol}"
        efs = self.list("enginefrontends", sel)
        if len(efs) != 1:
            raise AssertionError(f"one engine-frontend expected before the move, not {len(efs)}")
        ef_uid, ef_name = efs[0]["metadata"]["uid"], efs[0]["metadata"]["name"]
        first = [e["metadata"]["name"] for e in self.list("engines", sel)]
        snap_crs = {x["metadata"]["name"] for x in self.list("snapshots", sel)
                    if (x.get("status") or {}).get("creationTime")}
        t_events = time.time()
        self.patch("volumes", self.vol, {"spec": {"engineNodeID": node}})
        seen, t0 = {}, time.monotonic()
        wedged = {"since": None, "done": False}
        crashed = {"done": crash is None}
        phases = []  # (switchoverState, s after the patch it was first seen), as it changed

        def note(k, v):
            if v not in seen.setdefault(k, []):
                seen[k].append(v)

        def unwedge(engines):
            """longhorn-manager v1.12.1's own race (longhorn/longhorn#13951, fixed in 1.12.2 by
            longhorn-manager#5188): after the engine-frontend moved, the manager updates the old
            engine (active false) and the new one (active true) from its cache; when the old
            engine's status was written in between, the old one's update conflicts, the new one's
            lands, and from then on every sync of the volume stops at "BUG: found the second
            active engine". Nothing talon answers changes that state. When both engines stay
            active 20 s after the frontend targets the new one, the old engine's CR is deleted,
            Longhorn's documented remedy for this wedge, and the run says so (PEER line)."""
            active = [e for e in engines if e["spec"].get("active")]
            new = [e for e in active if e["spec"].get("nodeID") == node and e["metadata"]["name"] not in first]
            old = [e for e in active if e["metadata"]["name"] in first]
            efs = self.list("enginefrontends", sel)
            switched = bool(new) and len(efs) == 1 and \
                efs[0]["spec"].get("engineName") == new[0]["metadata"]["name"] and \
                (efs[0].get("status") or {}).get("targetIP") == (new[0].get("status") or {}).get("storageIP")
            if not (len(active) == 2 and new and old and switched) or wedged["done"]:
                wedged["since"] = None
                return
            wedged["since"] = wedged["since"] or time.monotonic()
            if time.monotonic() - wedged["since"] < 20:
                return
            name = old[0]["metadata"]["name"]
            say(f"longhorn-manager's two-active-engines wedge (longhorn/longhorn#13951): deleting {name}")
            print(f"PEER longhorn-manager v1.12.1 wedged with two active engines after the switch-over "
                  f"(longhorn/longhorn#13951, fixed in v1.12.2); its remedy applied: old engine {name} "
                  f"deleted", flush=True)
            self.c.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "engines", name)
            wedged["done"] = True

        def moved():
            self.c.manager_alive()
            st = self.get("volumes", self.vol).get("status", {})
            note("state", st.get("state"))
            note("switchoverState", st.get("switchoverState") or "")
            if not phases or phases[-1][0] != (st.get("switchoverState") or ""):
                phases.append((st.get("switchoverState") or "", round(time.monotonic() - t0, 2)))
            if not crashed["done"] and st.get("switchoverState") == crash[1]:
                self.kill_talon(crash[0], 10)
                crashed["done"] = True
            if st.get("state") != "attached":
                raise AssertionError(f"the volume left attached during the move: {st.get('state')}; "
                                     f"seen {seen}")
            for f in self.list("enginefrontends", sel):
                note(f"engine-frontend {f['metadata']['name']} phase",
                     f.get("status", {}).get("switchoverPhase") or "")
            engines = self.list("engines", sel)
            for e in engines:
                es = e.get("status", {})
                note(f"engine {e['metadata']['name']} on {e['spec'].get('nodeID')}",
                     f"{es.get('currentState')}: {(es.get('message') or '')[:200]}")
            unwedge(engines)
            for e in engines:
                es = e.get("status", {})
                if e["metadata"]["name"] not in first and es.get("currentState") == "running" \
                        and es.get("storageIP") and es.get("port"):
                    writer.add_path(es["storageIP"], es["port"])
            return (not st.get("switchoverState") and len(engines) == 1
                    and engines[0]["spec"].get("nodeID") == node
                    and engines[0]["metadata"]["name"] not in first
                    and st.get("currentEngineNodeID") == node)

        self.wait(f"the engine moved to {node}: one engine there, switch-over state empty", moved, 300)
        moved_s = time.monotonic() - t0
        if not crashed["done"]:
            # the phase came and went between two polls: this move tested no crash, said so
            # (tests/summary.py lists it as a skipped part)
            print(f"SKIP relocate-crash-{crash[0]}-{crash[1]}: the move to {node} passed "
                  f"{crash[1]} between two looks; no talon was killed", flush=True)
        say(f"engine moved to {node} in {moved_s:.1f} s; the manager's view {json.dumps(seen)}")
        engine = self.list("engines", sel)[0]
        es = engine.get("status", {})

        def frontend_on_new():
            efs = self.list("enginefrontends", sel)
            if len(efs) != 1:
                return False
            f = efs[0]
            fs = f.get("status", {})
            want = f"{es.get('storageIP')}:{es.get('port')}"
            paths = {f"{p.get('targetIP')}:{p.get('targetPort')}": p.get("anaState")
                     for p in fs.get("paths") or []}
            return (f["metadata"]["uid"] == ef_uid and f["spec"].get("engineName") == engine["metadata"]["name"]
                    and f"{fs.get('targetIP')}:{fs.get('targetPort')}" == want
                    and fs.get("activePath") == want and paths.get(want) == "optimized"
                    and not fs.get("switchoverPhase"))

        self.wait(f"engine-frontend {ef_name} (the same object) targets {engine['metadata']['name']}, "
                  "its active path optimized", frontend_on_new)
        events = [f"{e.reason}: {(e.message or '')[:200]}"
                  for e in self.c.core.list_namespaced_event(NS).items
                  if self.vol in (e.involved_object.name or "")
                  and (e.last_timestamp or e.event_time or e.first_timestamp)
                  and (e.last_timestamp or e.event_time or e.first_timestamp).timestamp() >= t_events - 1]
        failed = [e for e in events if e.startswith("FailedSwitchover")]
        if failed and crash:
            say(f"FailedSwitchover events while talon of {crash[0]} was down (retried): {failed}")
        elif failed:
            raise AssertionError(f"FailedSwitchover events during the move: {failed}")
        say(f"its events: {'; '.join(sorted(set(events))) or 'none'}")
        self.wait_healthy(f"healthy with the engine on {node}")
        # the new engine lists the snapshots with their creation times (the manager syncs its
        # Snapshot CRs from them)
        snaps = self.list("engines", sel)[0].get("status", {}).get("snapshots") or {}
        gone = sorted(snap_crs - {x["metadata"]["name"] for x in self.list("snapshots", sel)})
        if gone:
            # longhorn-manager v1.12.1's engine controller (syncSnapshotCRs) deletes the
            # Snapshot CR of every snapshot with a creation time the new engine does not list
            # yet (its status is empty until its monitor runs; the guard of longhorn#5992
            # covers live migration, not this switch-over), and its snapshot controller then
            # removes the snapshot through the new engine: the manager's, told
            say(f"snapshot CRs the manager deleted during the move (and the snapshots with them): {gone}")
        untimed = [n for n, x in snaps.items() if n != "volume-head" and not x.get("created")]
        if untimed:
            # the manager's snapshot controller would take each for a snapshot not taken yet
            # and hold the volume attached with its ticket
            raise AssertionError(f"snapshots the new engine lists without a creation time: {untimed}")
        say(f"snapshots the new engine lists: {sorted(snaps)}, each with its creation time")
        ep = self.wait("the new engine's endpoint", lambda: self.list("engines", sel)[0]["status"].get("endpoint"))
        rest = ep.split("://", 1)[-1]
        hostport, _, self.nqn = rest.partition("/")
        self.addr, self.port = hostport.rsplit(":", 1)
        say(f"engine endpoint now {ep}")
        # the move ends when the new engine reaches its local replica directly again (it read it
        # through the replica's export while the old engine was there): the writer stays on
        # through that last member move too
        direct_s = self.direct_again(node)
        r = writer.stop()
        say(f"the writer through the move: {r['runtime']:.1f} s, {r['iops']:.0f} IOPS of 4 KiB verified, "
            f"0 failed, the longest I/O {r['max_latency_us'] / 1000:.1f} ms, paths {writer.paths}"
            + (f", connects refused and tried again: {writer.refused}" if writer.refused else ""))
        print(f"WRITER the move to {node}: runtime_s={r['runtime']:.1f} iops={r['iops']:.0f} "
              f"longest_io_ms={r['max_latency_us'] / 1000:.1f} direct_again_s={direct_s:.1f}", flush=True)
        self.check(data, f"the data after the move to {node}")
        return {"moved_s": moved_s, "direct_s": direct_s, "phases": phases, "writer": r, "crash": crash}
        # written past `data` (which later steps read again), read back
        more = pattern(0x69)
        self.dd(more, offset=16 * MIB)
        self.check(more, f"the data written after the move to {node}", 16 * MIB)
        return data

    def rebuilt(self):
        # 25-135 s here; a rebuild the manager gives up on (ReplicaAdd's 60 s, then a new replica
        # after its backoff) needs a second round, which a loaded CI machine took past 240 s
        self.wait_healthy("the replica rebuilt: the volume healthy again, 2 replicas running", 420)

    def expand(self):
        new = 2 * SIZE
        self.patch("volumes", self.vol, {"spec": {"size": str(new)}})

        def grown():
            e = self.list("engines", f"longhornvolume={self.vol}")[0].get("status", {})
            st = self.get("volumes", self.vol).get("status", {})
            return int(e.get("currentSize") or 0) == new and not e.get("isExpanding") \
                and st.get("expansionRequired") is not True

        self.wait(f"the volume expanded online to {new}", grown)
        self.wait_healthy("healthy after the expansion")

    def revert(self, snap):
        """Detach, attach in maintenance mode (frontend disabled), revert through the manager's
        REST API (port 9500 of node 1's manager), detach, attach again."""
        self.detach()
        self.attach(maintenance=True)
        k = self.c.nodes[NODE]["k"]
        body = json.dumps({"name": snap}).encode()
        conn = lh.http.client.HTTPConnection(f"{lh.NET}.{k}.2", 9500, timeout=60)
        conn.request("POST", f"/v1/volumes/{self.vol}?action=snapshotRevert", body,
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        text = r.read().decode(errors="replace")
        if r.status != 200:
            raise RuntimeError(f"snapshotRevert to {snap}: HTTP {r.status}: {text[:1000]}")
        self.detach()
        self.attach()

    # ---- V2 live migration (issue 53) ------------------------------------------------------------
    def on_volume(self, vol, fn):
        """`fn` with the steps acting on volume `vol` (its endpoint too), the current one's after."""
        was = (self.vol, getattr(self, "addr", None), getattr(self, "port", None), getattr(self, "nqn", None))
        self.vol = vol
        try:
            return fn()
        finally:
            self.vol, self.addr, self.port, self.nqn = was

    def tickets(self, tickets):
        """The migratable volume's csi-attacher tickets: {id: node or None (dropped)}."""
        self.patch("volumeattachments", self.vol, {"spec": {"attachmentTickets": {
            t: ({"id": t, "type": "csi-attacher", "nodeID": n, "parameters": {"disableFrontend": "false"}}
                if n else None) for t, n in tickets.items()}}})

    def use_frontend(self, ef):
        """The steps' I/O goes to engine-frontend `ef`'s endpoint (nvmf://ip:port/nqn)."""
        ep = ef.get("status", {}).get("endpoint") or ""
        hostport, _, self.nqn = ep.split("://", 1)[-1].partition("/")
        self.addr, self.port = hostport.rsplit(":", 1)
        say(f"I/O through engine-frontend {ef['metadata']['name']} on {ef['spec'].get('nodeID')}: {ep}")

    def pairs(self):
        """The volume's engines and engine-frontends: {name: (node, currentState)}, each."""
        sel = f"longhornvolume={self.vol}"
        es = {e["metadata"]["name"]: (e["spec"].get("nodeID"), e.get("status", {}).get("currentState"))
              for e in self.list("engines", sel)}
        fs = {f["metadata"]["name"]: (f["spec"].get("nodeID"), f.get("status", {}).get("currentState"))
              for f in self.list("enginefrontends", sel)}
        return es, fs

    def migrate_create(self):
        """A migratable V2 volume (accessMode rwx), attached on node 1 by a csi-attacher ticket,
        a pattern written and read back, a snapshot (both engines must list it for the manager to
        confirm a migration)."""
        spec = {"size": str(SIZE), "numberOfReplicas": self.replicas, "dataEngine": "v2", "frontend": "nvmf",
                "accessMode": "rwx", "migratable": True}
        self.c.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "volumes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Volume", "metadata": {"name": self.vol}, "spec": spec})
        self.wait("the migratable volume detached (created)",
                  lambda: self.get("volumes", self.vol).get("status", {}).get("state") == "detached")
        self.wait("its VolumeAttachment", lambda: self.get("volumeattachments", self.vol))
        self.tickets({"csi-1": NODE})
        self.wait_healthy("the migratable volume attached on node 1 and healthy")
        ef = self.wait("its engine-frontend's endpoint", lambda: next(
            (f for f in self.list("enginefrontends") if f["metadata"]["name"].startswith(f"{self.vol}-ef-")
             and f.get("status", {}).get("endpoint")), None))
        self.use_frontend(ef)
        data = self.io(0x4D)
        self.snapshot("e2e-mig-snap-1")
        return data

    def migrate_start(self, data, ticket, node, crash=None):
        """A second csi-attacher ticket for `node`: the manager starts a live migration there (a
        second engine and a second engine-frontend over the same replicas). Waits for what the
        manager waits for: spec.migrationNodeID and status.currentMigrationNodeID `node`, the new
        engine running there with every replica RW, the new engine-frontend running with an
        endpoint, the ticket satisfied; the old pair still running. Then `data` reads back through
        the new engine-frontend. Returns the old and new (engine, engine-frontend) names.
        `crash`: the node whose talon is killed (-9; its spdk_tgt serves on, the stand-in
        kubelet starts it again 10 s later) as soon as the manager's new engine CR is there;
        the serving engine must then still keep every member, and the migration get ready."""
        old_es, old_fs = self.pairs()
        # the serving pair's host writes on while the second engine is made (its members go
        # behind their exports for it): no I/O of it fails
        with self.writing(f"the start of the migration to {node}"):
            return self.migrate_wait(data, ticket, node, old_es, old_fs, crash)

    def serving_intact(self, v, engine, why):
        """Fails unless `engine` holds every replica RW and volume `v` (as just read) is healthy:
        a migration's serving engine never loses a member to it. `why` ends the error."""
        modes = self.get("engines", engine).get("status", {}).get("replicaModeMap") or {}
        rob = v.get("status", {}).get("robustness")
        if len(modes) != self.replicas or any(m != "RW" for m in modes.values()) or rob != "healthy":
            raise AssertionError(f"the serving engine {engine} lost a member {why}: modes {modes}, volume {rob}")

    def migrate_wait(self, data, ticket, node, old_es, old_fs, crash=None):
        self.tickets({ticket: node})
        seen = []
        crashed = {"at": None}

        def ready():
            v = self.get("volumes", self.vol)
            es, fs = self.pairs()
            if crash and crashed["at"] is None and any(n not in old_es and nd == node for n, (nd, _) in es.items()):
                self.kill_talon(crash, 10)
                crashed["at"] = time.monotonic()
            va = self.get("volumeattachments", self.vol)
            sat = ((va.get("status", {}).get("attachmentTicketStatuses") or {}).get(ticket) or {}).get("satisfied")
            now = (v["spec"].get("migrationNodeID"), v.get("status", {}).get("currentMigrationNodeID"),
                   v.get("status", {}).get("state"), es, fs, sat)
            if not seen or seen[-1] != now:
                seen.append(now)
            # the serving engine never loses a member to the migration: every replica stays RW
            # in it and the volume healthy throughout (a talon killed meanwhile included)
            for n in old_es:
                self.serving_intact(v, n, f"during the migration{' (a talon killed)' if crashed['at'] else ''}"
                                          f"; seen {seen}")
            new_e = [n for n, (nd, st) in es.items() if n not in old_es and nd == node and st == "running"]
            new_f = [n for n, (nd, st) in fs.items() if n not in old_fs and nd == node and st == "running"]
            if not (now[0] == now[1] == node and new_e and new_f and sat):
                return False
            e = self.get("engines", new_e[0]).get("status", {})
            modes = e.get("replicaModeMap") or {}
            f = self.get("enginefrontends", new_f[0])
            fs_ = f.get("status", {})
            if len(modes) != self.replicas or any(m != "RW" for m in modes.values()) \
                    or not fs_.get("endpoint") or f["spec"].get("engineName") != new_e[0] \
                    or f"{fs_.get('targetIP')}:{fs_.get('targetPort')}" != f"{e.get('storageIP')}:{e.get('port')}":
                return False
            if any(st != "running" for _, st in list(old_es.values()) + list(old_fs.values())):
                raise AssertionError(f"the old pair stopped during the migration: {es} {fs}")
            return new_e[0], f

        t0 = time.monotonic()
        try:
            new_e, ef = self.wait(f"the migration to {node} ready (second engine and engine-frontend there, "
                                  f"ticket {ticket} satisfied)", ready, 180)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n(migrationNodeID, currentMigrationNodeID, state, engines, frontends, "
                               f"satisfied) seen: {seen}") from e
        if crash and crashed["at"] is None:
            raise AssertionError(f"the migration to {node} got ready before its new engine CR was seen: "
                                 f"no talon was killed")
        killed = f", {time.monotonic() - crashed['at']:.1f} s after {crash}'s talon was killed" if crash else ""
        say(f"migration to {node} ready in {time.monotonic() - t0:.1f} s{killed}: {seen[-1]}")
        # both engines list the same snapshots (what the manager's confirmation waits for)
        snaps = {n: sorted(k for k in (self.get("engines", n).get("status", {}).get("snapshots") or {})
                           if k != "volume-head") for n in [*old_es, new_e]}
        if len({tuple(x) for x in snaps.values()}) != 1:
            raise AssertionError(f"the two engines list different snapshots: {snaps}")
        say(f"snapshots listed by the engines: {snaps}")
        self.use_frontend(ef)
        self.check(data, f"the data read through the new engine-frontend on {node}")
        return list(old_es), list(old_fs), new_e, ef["metadata"]["name"]

    def gone_from_talon(self, node, names):
        """Names of `names` that `node`'s talon still reports (its instance manager's status)."""
        im = self.get("instancemanagers", self.im[node]).get("status", {})
        there = set()
        for k in ["instanceEngines", "instanceReplicas", "instances", "instanceEngineFrontends"]:
            there |= set(im.get(k) or {})
        return sorted(there & set(names))

    def migrate_end(self, node, keep_e, keep_f, drop_e, drop_f, drop_node, what):
        """After a confirmation or a rollback: one engine (`keep_e`) and one engine-frontend
        (`keep_f`), both on `node`; `drop_e`/`drop_f` gone from the CRs and from `drop_node`'s
        talon; no migration left; attached and healthy with every replica RW, the Replicas
        `keep_e`'s; the steps' I/O then goes through `keep_f`."""
        seen = []

        def done():
            v = self.get("volumes", self.vol)
            vs, st = v["spec"], v.get("status", {})
            es, fs = self.pairs()
            now = (vs.get("nodeID"), st.get("currentNodeID"), st.get("currentEngineNodeID"),
                   vs.get("migrationNodeID") or "", st.get("currentMigrationNodeID") or "", es, fs)
            if not seen or seen[-1] != now:
                seen.append(now)
            return (now[:5] == (node, node, node, "", "") and set(es) == {keep_e} and set(fs) == {keep_f}
                    and es[keep_e] == (node, "running") and fs[keep_f] == (node, "running")
                    and not self.gone_from_talon(drop_node, [*drop_e, *drop_f]))

        t0 = time.monotonic()
        try:
            self.wait(f"{what}: one engine and one engine-frontend, on {node}", done, 180)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n(spec.nodeID, currentNodeID, currentEngineNodeID, migrationNodeID, "
                               f"currentMigrationNodeID, engines, frontends) seen: {seen}") from e
        say(f"{what} in {time.monotonic() - t0:.1f} s: {seen[-1]}")
        self.wait_healthy(f"healthy after the {what}")
        reps = self.list("replicas", f"longhornvolume={self.vol}")
        bad = [(r["metadata"]["name"], r["spec"].get("engineName"), r["spec"].get("migrationEngineName"))
               for r in reps if r["spec"].get("engineName") != keep_e or r["spec"].get("migrationEngineName")]
        if bad:
            raise AssertionError(f"replicas not (only) of {keep_e} after the {what}: {bad}")
        self.use_frontend(self.get("enginefrontends", keep_f))

    def migrate_confirm(self, data, mig, drop_ticket, node, old_node):
        """Confirmation: the old node's ticket dropped (KubeVirt deletes the source pod)."""
        old_e, old_f, new_e, new_f = mig
        # the new pair's host writes on while the old pair goes and the members come back to
        # their lvols: no I/O of it fails
        with self.writing(f"the confirmation on {node}"):
            self.tickets({drop_ticket: None})
            self.migrate_end(node, new_e, new_f, old_e, old_f, old_node, "migration confirmed")
            self.direct_again(node)
        self.check(data, f"the data after the migration to {node}")
        more = pattern(0x96)
        self.dd(more, offset=16 * MIB)
        self.check(more, f"the data written after the migration to {node}", 16 * MIB)

    def migrate_rollback(self, data, mig, drop_ticket, node, new_node):
        """Rollback: the migration node's ticket dropped: the new pair goes, the old one serves."""
        old_e, old_f, new_e, new_f = mig
        if len(old_e) != 1 or len(old_f) != 1:
            raise AssertionError(f"one engine and one engine-frontend expected before, not {old_e} {old_f}")
        # the serving (old) pair's host writes on while the new pair goes and its member comes
        # back to its lvol: no I/O of it fails
        self.use_frontend(self.get("enginefrontends", old_f[0]))
        with self.writing(f"the rollback on {node}"):
            self.tickets({drop_ticket: None})
            self.migrate_end(node, old_e[0], old_f[0], [new_e], [new_f], new_node, "migration rolled back")
            self.direct_again(node)
        self.check(data, f"the data after the rollback, on {node}")

    def migrate_failed(self, data, ticket, node, serving_node):
        """A migration whose new engine fails: `node`'s talon reports the migratable volume's
        engines there in error (fault longhorn-engine-error, scoped to this volume's engines:
        the other volume's engine on `node` serves on) when the ticket for `node` comes. The
        serving pair on `serving_node` keeps every replica RW and the volume healthy at every
        look while the manager holds the failed engine; then the ticket is dropped (KubeVirt
        gives the migration up): the new pair goes, the old one serves on, the data reads back."""
        old_es, old_fs = self.pairs()
        if len(old_es) != 1 or len(old_fs) != 1:
            raise AssertionError(f"one engine and one engine-frontend expected before, not {old_es} {old_fs}")
        (keep_e,), (keep_f,) = list(old_es), list(old_fs)
        self.use_frontend(self.get("enginefrontends", keep_f))
        self.fault(node, "longhorn-engine-error", True, only=f"{self.vol}-e-")
        seen = []
        try:
            with self.writing(f"a migration to {node} whose new engine fails"):
                self.tickets({ticket: node})

                def failed():
                    v = self.get("volumes", self.vol)
                    es, fs = self.pairs()
                    now = (v["spec"].get("migrationNodeID"), v.get("status", {}).get("state"), es, fs)
                    if not seen or seen[-1] != now:
                        seen.append(now)
                    self.serving_intact(v, keep_e, f"to the failed migration; seen {seen}")
                    if es.get(keep_e) != (serving_node, "running"):
                        raise AssertionError(f"the serving engine {keep_e} stopped in the failed migration: "
                                             f"{es}; seen {seen}")
                    return [n for n, (nd, st) in es.items() if n != keep_e and nd == node and st == "error"]

                bad = self.wait(f"the new engine on {node} in error", failed, 120)
                say(f"the new engine {bad} in error; the manager holds it ({seen[-1]})")
                # the manager keeps the failed engine while the ticket stands: the serving pair
                # must stay untouched for a while
                t0 = time.monotonic()
                while time.monotonic() - t0 < 10:
                    failed()
                    time.sleep(1)
                new_es, new_fs = self.pairs()
                self.tickets({ticket: None})
                self.migrate_end(serving_node, keep_e, keep_f, [n for n in new_es if n != keep_e],
                                 [n for n in new_fs if n != keep_f], node, "failed migration given up")
        finally:
            self.fault(node, "longhorn-engine-error", False)
        say(f"what the manager did, as seen: {seen}")
        self.check(data, f"the data after the failed migration to {node}, on {serving_node}")

    def migrate_delete(self):
        """The migratable volume detached (its last ticket dropped) and deleted."""
        va = self.get("volumeattachments", self.vol)
        self.tickets({t: None for t in (va["spec"].get("attachmentTickets") or {})})
        self.wait("the migratable volume detached",
                  lambda: self.get("volumes", self.vol).get("status", {}).get("state") == "detached")
        self.delete()


def main():
    ap = argparse.ArgumentParser()
    for a in ["work", "longhorn", "cache", "spdk", "talon", "s3-endpoint"]:
        ap.add_argument(f"--{a}", required=True)
    ap.add_argument("--scenario", choices=["one-node", "two-nodes", "scale", "two-nodes+scale", "moves"],
                    default="one-node")
    ap.add_argument("--moves", type=int, default=10, help="moves: how many engine moves")
    ap.add_argument("--volumes", type=int, default=10, help="scale: how many volumes")
    ap.add_argument("--idle", type=float, default=60, help="scale: seconds of idle measured")
    ap.add_argument("--queues", type=int, default=4, help="scale: I/O queues of the connected host (0: none connected)")
    ap.add_argument("--metrics", help="scale, moves: where the measurements go (JSON)")
    a = ap.parse_args()
    then_scale = a.scenario == "two-nodes+scale"  # the scale steps after two-nodes, same cluster
    if then_scale:
        a.scenario = "two-nodes"
    if a.scenario == "scale" or then_scale:
        # one line per gRPC call received (the call counts); the log bytes count INFO and above
        os.environ.setdefault("TALON_E2E_LOG", "info,talon::longhorn::server=debug")
    # a SIGTERM (the Rust test's timeout) unwinds through the cleanup below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    c = lh.Cluster(a.work, a.longhorn, a.cache, a.spdk, a.talon, say)
    two = a.scenario in ("two-nodes", "scale", "moves")
    nodes = [NODE, "e2e-node-2"] if two else [NODE]
    s = Scenario(c, a.spdk, nodes, 2 if two else 1)
    s.s3 = a.s3_endpoint
    t0 = time.monotonic()
    failed = None
    if a.scenario == "scale":
        return scale_main(s, c, a, t0)
    if a.scenario == "moves":
        return moves_main(s, c, a, t0)
    sc = None
    if then_scale:
        import scale
        sc = scale.Scale(s, a.volumes, a.idle, a.queues)
        s.disk_bytes = sc.disk_size()
    try:
        cluster_steps(s)
        s.step("volume-create", s.volume)
        s.step("attach", s.attach)
        first = s.step("io", s.io)
        s.step("snapshot", s.snapshot)
        if not two:
            s.step("clone", lambda: s.clone(first))
        # a linked clone of two replicas is linked on both nodes (each by its own node); with
        # two, the second node's replica is then lost and rebuilt thin over its entrypoint
        s.step("clone-linked", lambda: s.clone(first, linked=True))
        s.step("backup-target", s.backup_target)
        s.step("backup", s.backup)
        if not two:
            # a DR volume follows the source's backups, then is activated
            s.step("dr-volume", s.dr_create)
            second = s.step("io-2", lambda: s.io(0xA5))
            s.step("snapshot-2", lambda: s.snapshot("e2e-snap-2"))
            s.step("backup-2", lambda: s.backup("e2e-snap-2", BACKUP_2))
            s.step("dr-follow", s.dr_follow)
            s.step("dr-activate", lambda: s.dr_activate(second))
        if two:
            # the cron set before io-2 (not in snapshot-hash): its first check may run during
            # io-2's writes (after the backup step, whose export of the snapshot the hash's would
            # meet)
            cron_before = s.hash_cron()
            s.step("io-2", lambda: s.io(0xA5))
            s.step("snapshot-hash", lambda: s.snapshot_hash(before=cron_before))
            # bit rot on node 2's replica: the manager's vote sets it ERR, talon takes it out of
            # the raid1 and it is rebuilt without its snapshots (the revert below reads them)
            s.step("corrupt-node-2", lambda: s.corrupt_replica(nodes[1], first))
            third = s.step("kill-node-2", lambda: s.kill_node(nodes[1], float(os.environ.get("TALON_E2E_OUTAGE", "20"))))
            s.step("rebuild", s.rebuilt)
            s.step("read-after-rebuild", lambda: s.check(third, "the data after the rebuild"))
            s.step("revert", lambda: s.revert("e2e-snap-1"))
            s.step("read-after-revert", lambda: s.check(first, "the data after the revert to e2e-snap-1"))
            s.step("expand", s.expand)
            s.step("read-after-expand", lambda: s.check(first, "the data after the expansion"))
            s.step("io-beyond-old-end", s.beyond_old_end)
            s.step("snapshot-delete", s.snapshot_delete)
            # last: each move makes a new engine (the snapshots it lists come from the replicas).
            # TALON_E2E_RELOCATE=0 leaves the moves out (issue 53)
            if os.environ.get("TALON_E2E_RELOCATE", "1") != "0":
                s.step("relocate-node-2", lambda: s.relocate(nodes[1], first))
                s.step("relocate-back", lambda: s.relocate(NODE, first))
                # a move the user takes back before the frontend switches: the manager removes the
                # new engine; the old one serves on, directly again
                s.step("relocate-cancel", lambda: s.relocate_cancel(nodes[1], NODE, first))
                s.step("relocate-reverted", lambda: s.relocate_reverted(nodes[1], NODE, first))
                # kill -9 of a talon mid-move (its spdk_tgt serves on): the new engine's node
                # while that engine is made, then the serving engine's node. When the manager
                # sees node 2's replica down as it makes the new engine, it gives that engine
                # one replica of two: talon makes it a raid1 all the same, so the manager's
                # rebuild of the other ends the move healthy (its source, node 1's replica,
                # still behind its export for the old engine: copied in node 1's own target).
                # TALON_E2E_CRASH=0 leaves them out
                if os.environ.get("TALON_E2E_CRASH", "1") != "0":
                    s.step("relocate-crash-new-node",
                           lambda: s.relocate(nodes[1], first, crash=(nodes[1], "preparing")))
                    s.step("relocate-crash-old-node", lambda: s.relocate(NODE, first, crash=(nodes[1], "preparing")))
                s.step("read-after-relocate", lambda: s.check(first, "the data after the moves"))
        if two and os.environ.get("TALON_E2E_MIGRATE", "1") != "0":
            # V2 live migration (issue 53), its own migratable volume: to node 2 and confirmed,
            # then back to node 1 and rolled back. TALON_E2E_MIGRATE=0 leaves it out
            mv = lambda fn: lambda: s.on_volume(MIGRATE, fn)
            md = s.step("migrate-create", mv(s.migrate_create))
            # with TALON_E2E_CRASH (the default), node 1's talon is killed (-9) in each start: the
            # serving engine's node (asked to share its replica) going to node 2, the new
            # engine's node coming back
            crash = NODE if os.environ.get("TALON_E2E_CRASH", "1") != "0" else None
            mig = s.step("migrate-start", mv(lambda: s.migrate_start(md, "csi-2", nodes[1], crash)))
            s.step("migrate-confirm", mv(lambda: s.migrate_confirm(md, mig, "csi-1", nodes[1], NODE)))
            back = s.step("migrate-back-start", mv(lambda: s.migrate_start(md, "csi-3", NODE, crash)))
            s.step("migrate-rollback", mv(lambda: s.migrate_rollback(md, back, "csi-3", nodes[1], NODE)))
            # a migration whose new engine fails (node 1's talon reports it in error), given up
            s.step("migrate-failed", mv(lambda: s.migrate_failed(md, "csi-4", NODE, nodes[1])))
            s.step("migrate-delete", mv(s.migrate_delete))
        s.step("detach", s.detach)
        s.step("delete", s.delete)
        s.step("restore", lambda: s.restore(first))
        s.step("nothing-left", s.nothing_left)
        probe = {k: (v["failed_probes"], v["first_failure"]) for k, v in c.pods.items() if v.get("probe")}
        say(f"liveness probe of the instance-manager pods (failed probes, first failure): {probe}")
        restarts = [k for k, v in c.pods.items() if v.get("threshold_reached")]
        if restarts:
            raise AssertionError(f"a kubelet would have restarted the instance-manager container of {restarts} "
                                 f"(liveness probe failed failureThreshold times in a row): {probe}")
        if sc:
            scale_steps(s, sc, a, "scale-")
    except Exception as e:  # noqa: BLE001 (reported with the logs)
        failed = e
        say(f"FAILED: {e}\n{traceback.format_exc()}")
        try:
            for line in s.why():
                print(f"why: {line}", file=sys.stderr, flush=True)
        except Exception as w:  # noqa: BLE001
            print(f"why: (not gathered: {w!r})", file=sys.stderr, flush=True)
        try:
            say(s.diag())
        except Exception:  # noqa: BLE001
            pass
    finally:
        t1 = time.monotonic()
        c.close()
        s.times.append(("cleanup", time.monotonic() - t1))
        print(f"STEP cleanup {time.monotonic() - t1:.1f}", flush=True)
    print(f"TOTAL {time.monotonic() - t0:.1f}", flush=True)
    return 1 if failed else 0


def cluster_steps(s):
    """The control plane, Longhorn's CRDs and managers, the nodes' disks and instance managers,
    up to the disks ready: the first steps of every scenario."""
    s.step("control-plane", s.control_plane)
    s.step("crds", s.crds)
    s.step("manager", s.manager)
    s.step("disk", s.disk)
    s.step("instance-manager", s.instance_manager)
    s.step("disk-ready", s.disk_ready)


def scale_steps(s, sc, a, prefix=""):
    """The scale scenario's own steps, on a cluster whose nodes, instance managers and disks are
    up (their step names after `prefix`)."""
    sc.events()  # what came before the volumes is not theirs
    s.step(f"{prefix}create-attach", sc.create_attach)
    s.step(f"{prefix}idle", sc.idle_window)
    if a.queues > 0:  # 0: no host connected (the CI run)
        s.step(f"{prefix}connected", sc.connected)
    s.step(f"{prefix}restart-node-2", sc.boot_storm)
    s.step(f"{prefix}detach-delete", sc.detach_delete)
    s.step(f"{prefix}nothing-left", sc.nothing_left)


def scale_main(s, c, a, t0):
    """The scale scenario (scale.py): N volumes created, attached, idle, node 2 restarted, all
    detached and deleted, nothing left; the measurements in --metrics."""
    import scale
    sc = scale.Scale(s, a.volumes, a.idle, a.queues)
    s.disk_bytes = sc.disk_size()

    def steps():
        cluster_steps(s)
        scale_steps(s, sc, a)

    def write(times, failed):
        sc.m["steps"], sc.m["failed"] = times, failed
        if a.metrics:
            sc.write(a.metrics)

    return measured(s, c, t0, steps, write)


def moves_main(s, c, a, t0):
    """The moves scenario (issue 53's benchmark, benches/longhorn_move.rs): one volume of 2
    replicas attached on node 1, the writer's steady IOPS, `--moves` engine relocations to node 2
    and back in turn, each with the writer through it until the new engine reaches its local
    replica directly again, the steady IOPS again (the engine back on node 1); the measurements
    in --metrics."""
    m = {"moves": []}
    steady = float(os.environ.get("LH_MOVE_STEADY", "10"))

    def steps():
        cluster_steps(s)
        s.step("volume-create", s.volume)
        s.step("attach", s.attach)
        data = s.step("io", s.io)
        m["before"] = s.step("steady-before", lambda: s.steady(steady))
        for i in range(a.moves):
            to = s.nodes[1] if i % 2 == 0 else NODE
            m["moves"].append(s.step(f"move-{i + 1}", lambda: s.relocate(to, data)))
        if a.moves % 2:
            s.step("move-home", lambda: s.relocate(NODE, data))
        m["after"] = s.step("steady-after", lambda: s.steady(steady))
        s.step("detach", s.detach)
        s.step("delete", s.delete)

    def write(times, failed):
        m["steps"], m["failed"] = times, failed
        if a.metrics:
            with open(a.metrics, "w") as f:
                json.dump(m, f, indent=1)

    return measured(s, c, t0, steps, write)


def measured(s, c, t0, steps, write):
    """A benchmark scenario's `steps`; a failure said with the cluster's state; then
    `write(step times, failure or None)` and the cluster's cleanup. The driver's exit status."""
    failed = None
    try:
        steps()
    except Exception as e:  # noqa: BLE001 (reported with the logs)
        failed = e
        say(f"FAILED: {e}\n{traceback.format_exc()}")
        try:
            say(s.diag()[-20000:])
        except Exception:  # noqa: BLE001
            pass
    finally:
        write(dict(s.times), repr(failed) if failed else None)
        t1 = time.monotonic()
        c.close()
        print(f"STEP cleanup {time.monotonic() - t1:.1f}", flush=True)
    print(f"TOTAL {time.monotonic() - t0:.1f}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
