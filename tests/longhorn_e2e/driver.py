"""Scenario 1 of the end-to-end test with Longhorn's real control plane (tests/longhorn_e2e.rs):
one node, a block disk on a loop device registered through Longhorn's Node CR, a V2 volume
(1 replica, frontend nvmf) attached with a VolumeAttachment ticket, a pattern written and read
back over its NVMe/TCP endpoint with spdk_dd, a snapshot, detach, delete; then nothing of it
left in SPDK or talon.

    driver.py --work DIR --longhorn DIR --cache DIR --spdk DIR --talon BIN

Exit 0 when every step passed; else the failing step, with the manager's and talon's logs
tail, on stderr. One line per step on stdout: `STEP <name> <seconds>`.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback

import cluster as lh
from cluster import HOST_NQN, NS, wait_for

NODE = "e2e-node-1"
VOLUME = "e2e-vol-1"
MIB = 1 << 20
SIZE = 128 * MIB
GROUP, VERSION = "longhorn.io", "v1beta2"
T_MANAGER, T_STEP = 240, 120


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Scenario:
    def __init__(self, c, spdk_dir):
        self.c, self.spdk_dir, self.times = c, spdk_dir, []

    def step(self, name, fn):
        say(f"step {name}")
        t0 = time.monotonic()
        r = fn()
        dt = time.monotonic() - t0
        self.times.append((name, dt))
        print(f"STEP {name} {dt:.1f}", flush=True)
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
        out = [f"--- longhorn-manager log tail ---\n{self.c.tail('longhorn-manager', 60, skip='level=debug')}"]
        for name in [n for n in self.c.procs if n.startswith("talon-")]:
            noise = ("kernel module not loaded", "Longhorn asked for")
            out.append(f"--- {name} log tail ---\n{self.c.tail(name, 60, skip=noise)}")
        for plural in ["volumes", "engines", "replicas", "instancemanagers"]:
            try:
                items = self.list(plural)
            except Exception as e:  # noqa: BLE001
                items = [repr(e)]
            for it in items:
                st = it.get("status", {}) if isinstance(it, dict) else it
                out.append(f"--- {plural} {it.get('metadata', {}).get('name') if isinstance(it, dict) else ''}: "
                           f"{json.dumps(st)[:1500]}")
        if self.c.kubelet_error:
            out.append(f"--- stand-in kubelet: {self.c.kubelet_error}")
        return "\n".join(out)

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
        c = self.c
        c.bootstrap([NODE])
        c.start_iscsid()
        c.start_kubelet()
        c.start_manager(NODE)
        self.wait("Longhorn Node CR of the node", lambda: self.get("nodes", NODE), T_MANAGER)

    def instance_manager(self):
        def running():
            ims = [im for im in self.list("instancemanagers")
                   if im["spec"].get("dataEngine") == "v2" and im["spec"].get("nodeID") == NODE]
            return ims and ims[0].get("status", {}).get("currentState") == "running" and ims[0]

        im = self.wait("the V2 instance manager running (talon serving it)", running, T_MANAGER)
        self.im = im["metadata"]["name"]
        say(f"instance manager {self.im} at {im['status'].get('ip')}")

    def disk(self):
        """The block disk, registered on Longhorn's Node CR as soon as it exists: the manager's
        disk monitor looks every 30 s, so this overlaps with the instance manager's start."""
        self.dev = self.c.loop_device("disk-1", 1024 * MIB)
        self.patch("nodes", NODE, {"spec": {"disks": {"disk-1": {
            "path": self.dev, "diskType": "block", "diskDriver": "aio", "allowScheduling": True,
            "evictionRequested": False, "storageReserved": 0, "tags": []}}}})

    def disk_ready(self):
        def ready():
            ds = self.get("nodes", NODE).get("status", {}).get("diskStatus", {}).get("disk-1")
            if not ds:
                return False
            conds = {x["type"]: x["status"] for x in ds.get("conditions", [])}
            return conds.get("Ready") == "True" and conds.get("Schedulable") == "True" and ds

        ds = self.wait(f"disk-1 ({self.dev}) Ready and Schedulable", ready)
        say(f"disk-1: {self.dev}, uuid {ds.get('diskUUID')}, max {ds.get('storageMaximum')}")

    def volume(self):
        self.c.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "volumes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Volume", "metadata": {"name": VOLUME},
            "spec": {"size": str(SIZE), "numberOfReplicas": 1, "dataEngine": "v2", "frontend": "nvmf",
                     "accessMode": "rwo"}})
        self.wait("volume detached (created)",
                  lambda: self.get("volumes", VOLUME).get("status", {}).get("state") == "detached")

    def attach(self):
        self.wait("the volume's VolumeAttachment", lambda: self.get("volumeattachments", VOLUME))
        self.patch("volumeattachments", VOLUME, {"spec": {"attachmentTickets": {"e2e": {
            "id": "e2e", "type": "longhorn-api", "nodeID": NODE,
            "parameters": {"disableFrontend": "false"}}}}})

        def attached():
            st = self.get("volumes", VOLUME).get("status", {})
            return st.get("state") == "attached" and st.get("robustness") == "healthy"

        self.wait("volume attached and healthy", attached)
        engines = self.list("engines", f"longhornvolume={VOLUME}")
        ep = self.wait("the engine's endpoint",
                       lambda: self.list("engines", f"longhornvolume={VOLUME}")[0]["status"].get("endpoint"))
        say(f"engine {engines[0]['metadata']['name']} endpoint {ep}")
        rest = ep.split("://", 1)[-1]
        hostport, _, nqn = rest.partition("/")
        self.addr, self.port = hostport.rsplit(":", 1)
        self.nqn = nqn

    def io(self):
        data = bytes((i * 2654435761 >> (8 * (i % 4))) & 0xFF ^ 0x5A for i in range(8 * MIB))
        self.dd(data)
        back = self.dd(None, len(data))
        if back != data:
            raise AssertionError("the data read back over the volume's NVMe/TCP endpoint differs")

    def dd(self, data, length=0):
        w = self.c.work
        conf = f"{w}/dd.json"
        with open(conf, "w") as f:
            json.dump({"subsystems": [{"subsystem": "bdev", "config": [{
                "method": "bdev_nvme_attach_controller",
                "params": {"name": "dd", "trtype": "tcp", "adrfam": "ipv4", "traddr": self.addr,
                           "trsvcid": self.port, "subnqn": self.nqn, "hostnqn": HOST_NQN}}]}]}, f)
        argv = [f"{self.spdk_dir}/build/bin/spdk_dd", "--no-huge", "-s", "512", "--disable-cpumask-locks",
                "-c", "0x2", "-r", f"{w}/dd.sock", "--json", conf, "--bs", "65536"]
        f = f"{w}/dd.bin"
        if data is not None:
            with open(f, "wb") as out:
                out.write(data)
            argv += ["--if", f, "--ob", "ddn1"]
        else:
            if os.path.exists(f):
                os.remove(f)
            argv += ["--ib", "ddn1", "--of", f, "--count", str(length // 65536)]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"spdk_dd: exit {r.returncode}\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        if data is None:
            return open(f, "rb").read()
        return None

    def snapshot(self):
        self.c.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "snapshots", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Snapshot", "metadata": {"name": "e2e-snap-1"},
            "spec": {"volume": VOLUME, "createSnapshot": True}})
        st = self.wait("snapshot e2e-snap-1 readyToUse",
                       lambda: (s := self.get("snapshots", "e2e-snap-1").get("status", {})).get("readyToUse") and s)
        say(f"snapshot: {json.dumps(st)[:400]}")

    def detach(self):
        self.patch("volumeattachments", VOLUME, {"spec": {"attachmentTickets": {"e2e": None}}})
        self.wait("volume detached",
                  lambda: self.get("volumes", VOLUME).get("status", {}).get("state") == "detached")

    def delete(self):
        self.c.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "volumes", VOLUME)

        def gone():
            try:
                self.get("volumes", VOLUME)
                return False
            except lh.ApiException as e:
                return e.status == 404 and not self.list("replicas", f"longhornvolume={VOLUME}") \
                    and not self.list("engines", f"longhornvolume={VOLUME}")

        self.wait("volume, engine and replicas deleted", gone)

    def nothing_left(self):
        pod = self.im
        sock = f"{self.c.work}/{pod}/run/spdk.sock"
        rpc = f"{self.spdk_dir}/scripts/rpc.py"

        def leftovers():
            bdevs = json.loads(lh.run(sys.executable, rpc, "-s", sock, "bdev_get_bdevs").stdout)
            subs = json.loads(lh.run(sys.executable, rpc, "-s", sock, "nvmf_get_subsystems").stdout)
            left = [b["name"] for b in bdevs if b.get("product_name") != "AIO disk"
                    and VOLUME in json.dumps(b)] + \
                   [b["name"] for b in bdevs if b.get("product_name") in ("Raid Volume", "NVMe disk")]
            left += [s["nqn"] for s in subs if s.get("subtype") != "Discovery"]
            self.spdk_seen = ([f"{b['name']} ({b.get('product_name')})" for b in bdevs],
                              [s["nqn"] for s in subs])
            im = self.get("instancemanagers", pod).get("status", {})
            for k in ["instanceEngines", "instanceReplicas", "instances"]:
                left += [f"{k}/{n}" for n in (im.get(k) or {})]
            return left

        left = []

        def empty():
            nonlocal left
            left = leftovers()
            return not left

        try:
            self.wait("nothing of the volume left in SPDK and talon", empty, 60)
        except TimeoutError as e:
            raise AssertionError(f"left behind: {left}") from e
        say(f"SPDK after the delete: bdevs {self.spdk_seen[0]}, subsystems {self.spdk_seen[1]}")


def main():
    ap = argparse.ArgumentParser()
    for a in ["work", "longhorn", "cache", "spdk", "talon"]:
        ap.add_argument(f"--{a}", required=True)
    a = ap.parse_args()
    # a SIGTERM (the Rust test's timeout) unwinds through the cleanup below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    c = lh.Cluster(a.work, a.longhorn, a.cache, a.spdk, a.talon, say)
    s = Scenario(c, a.spdk)
    t0 = time.monotonic()
    failed = None
    try:
        s.step("control-plane", s.control_plane)
        s.step("crds", s.crds)
        s.step("manager", s.manager)
        s.step("disk", s.disk)
        s.step("instance-manager", s.instance_manager)
        s.step("disk-ready", s.disk_ready)
        s.step("volume-create", s.volume)
        s.step("attach", s.attach)
        s.step("io", s.io)
        s.step("snapshot", s.snapshot)
        s.step("detach", s.detach)
        s.step("delete", s.delete)
        s.step("nothing-left", s.nothing_left)
        probe = {k: (v["failed_probes"], v["first_failure"]) for k, v in c.pods.items() if v.get("probe")}
        say(f"liveness probe of the instance-manager pods (failed probes, first failure): {probe}")
        restarts = [k for k, v in c.pods.items() if v.get("threshold_reached")]
        if restarts:
            raise AssertionError(f"a kubelet would have restarted the instance-manager container of {restarts} "
                                 f"(liveness probe failed failureThreshold times in a row): {probe}")
    except Exception as e:  # noqa: BLE001 (reported with the logs)
        failed = e
        say(f"FAILED: {e}\n{traceback.format_exc()}")
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


if __name__ == "__main__":
    sys.exit(main())
