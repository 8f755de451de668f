"""The scale scenario (issue 52): N V2 volumes through the real manager at once, on two nodes.

    create N volumes (2 replicas, nvmf) at once, each attached as soon as its VolumeAttachment
      exists ──> all attached and healthy (per volume: seconds from the first create)
    idle IDLE s under the manager's polling: CPU, RSS and log bytes of talon and spdk_tgt of each
      node, the DPDK heap of each spdk_tgt, the gRPC calls talon received (its log's call lines)
    a host connected to every engine (spdk_nvme_perf, QUEUES I/O queues each, QD1): the heap
      of the engines' spdk_tgt again (what a connected volume costs)
    node 2's talon and spdk_tgt killed (-9) and started again at once (the boot storm) ──> all
      healthy with both replicas RW (per volume: seconds from the kill; a volume the manager
      never saw degraded within 60 s counts 0: its engine's NVMe/TCP paths to node 2
      reconnected before they were given up)
    all detached, all deleted ──> nothing left: no lvol, no subsystem, no Longhorn CR

The manager's Warning events and its error lines are counted per phase. Everything measured goes
to --metrics (JSON) for benches/longhorn_scale.rs; the steps print as the other scenarios'.
talon runs with `talon::longhorn::server=debug` here (one line per call received, what the call
counts come from); "log bytes" counts the lines at the default level (INFO and above) only.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import cluster as lh
from cluster import HOST_NQN, NS

MIB = 1 << 20
SIZE = 32 * MIB
GROUP, VERSION = "longhorn.io", "v1beta2"
CALL = re.compile(r"longhorn gRPC call.*?method=(\S+)")
CALL_MS = re.compile(r"longhorn gRPC call.*?method=(\S+).*?\bms=(\d+)")
# the programs whose CPU the storm is split between (by executable name)
PROGRAMS = ("talon", "spdk_tgt", "longhorn-manager", "kube-apiserver", "etcd", "python")
TICK = os.sysconf("SC_CLK_TCK")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round((len(xs) - 1) * p))] if xs else None


class Scale:
    def __init__(self, s, n, idle, queues):
        self.s, self.c, self.n, self.idle, self.queues = s, s.c, n, idle, queues
        self.vols = [f"scale-{i:03d}" for i in range(1, n + 1)]
        self.m = {"volumes": n, "idle_s": idle, "queues": queues, "phases": {}}
        self.events_seen = set()

    # ---- what the cluster says, in one listing per kind --------------------------------------
    def health(self):
        """{volume: (attached, healthy)} from one listing of volumes, engines and replicas."""
        vols = {v["metadata"]["name"]: v for v in self.s.list("volumes")}
        engines, reps = {}, {}
        for e in self.s.list("engines"):
            engines[e["metadata"].get("labels", {}).get("longhornvolume")] = e
        for r in self.s.list("replicas"):
            reps.setdefault(r["metadata"].get("labels", {}).get("longhornvolume"), []).append(r)
        out = {}
        for v in self.vols:
            st = (vols.get(v) or {}).get("status", {})
            attached = st.get("state") == "attached"
            running = [r for r in reps.get(v, []) if r.get("status", {}).get("currentState") == "running"]
            modes = ((engines.get(v) or {}).get("status", {}).get("replicaModeMap") or {})
            names = {r["metadata"]["name"] for r in running}
            healthy = (attached and st.get("robustness") == "healthy" and len(running) == 2
                       and not any(r.get("spec", {}).get("failedAt") for r in running)
                       and set(modes) == names and all(m == "RW" for m in modes.values()))
            out[v] = (attached, healthy)
        return out

    def events(self):
        """The manager's Warning events and error lines since the last call: {reason: count}."""
        got = {}
        for e in self.c.core.list_namespaced_event(NS).items:
            if e.type != "Warning" or e.metadata.uid in self.events_seen:
                continue
            self.events_seen.add(e.metadata.uid)
            k = f"event {e.reason} ({e.involved_object.kind})"
            got[k] = got.get(k, 0) + (e.count or 1)
            self.m.setdefault("event_samples", {}).setdefault(k, f"{e.involved_object.name}: {e.message}"[:400])
        for node in self.s.nodes:
            name = f"longhorn-manager-{node}"
            off = self.m.setdefault("_mgr_off", {}).get(name, 0)
            with open(self.c.logfile(name), errors="replace") as f:
                f.seek(off)
                text = f.read()
                self.m["_mgr_off"][name] = f.tell()
            for line in text.splitlines():
                if "level=error" in line:
                    msg = re.search(r'msg="([^"]{0,80})', line)
                    k = f"{node} error: {msg.group(1) if msg else line[:80]}"
                    got[k] = got.get(k, 0) + 1
        return got

    def phase(self, name, **kv):
        ev = self.events()
        self.m["phases"][name] = dict(kv, manager_errors=ev)
        if ev:
            lh_say(f"{name}: the manager's warnings and errors: {json.dumps(ev)[:1500]}")

    # ---- the processes of a node ---------------------------------------------------------------
    def pids(self, node):
        pod = self.s.im[node]
        run_dir = f"{self.c.work}/{pod}/run"
        talon = spdk = None
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            line = b" ".join(cmd).decode(errors="replace")
            if run_dir not in line:
                continue
            exe = os.path.basename(cmd[0].decode(errors="replace"))
            if exe in ("spdk_tgt", "nvmf_tgt"):
                spdk = int(d)
            elif (exe.startswith("talon") or exe == "longhorn") and " serve " in line:
                talon = int(d)
        return {"talon": talon, "spdk_tgt": spdk}

    @staticmethod
    def cpu_ticks(pid):
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])

    @staticmethod
    def rss_mib(pid):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return None

    def heap_mib(self, node):
        """The DPDK heap in use of node's spdk_tgt (env_dpdk_get_mem_stats' dump, Alloc_size).
        Every target writes the same file (/tmp/spdk_mem_dump.txt), and talon asks for it too
        (its memory sizing, every minute): a dump being rewritten is read again."""
        pod = self.s.im[node]
        sock = f"{self.c.work}/{pod}/run/spdk.sock"
        for _ in range(10):
            out = lh.run(sys.executable, f"{self.s.spdk_dir}/scripts/rpc.py", "-s", sock,
                         "env_dpdk_get_mem_stats").stdout
            pid = self.pids(node)["spdk_tgt"]
            dump = open(f"/proc/{pid}/root{json.loads(out)['filename']}").read()
            parts = dump.split("DPDK malloc stats.")
            if len(parts) == 2 and "DPDK malloc heaps." in parts[1]:
                stats = parts[1].split("DPDK malloc heaps.")[0]
                return sum(int(x) for x in re.findall(r"Alloc_size:(\d+)", stats)) / MIB
            time.sleep(0.3)
        raise RuntimeError(f"the DPDK heap of {node}'s spdk_tgt: no whole dump in 10 tries")

    def talon_log(self, node):
        return self.c.logfile(f"talon-{self.s.im[node]}")

    # ---- steps ---------------------------------------------------------------------------------
    def disk_size(self):
        """Room for N thin replicas per disk: a sparse loop device sized for N (the manager
        schedules by size; little is written)."""
        return max(1024 * MIB, self.n * SIZE * 2 + 512 * MIB)

    @staticmethod
    def program_ticks():
        """CPU ticks used so far by each of PROGRAMS' live processes (summed per program), and
        the machine's busy ticks: a window's difference says who the storm's CPU went to."""
        per = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                exe = os.path.basename(open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")[0].decode(errors="replace"))
                ticks = Scale.cpu_ticks(d)
            except (OSError, IndexError, ValueError):
                continue
            name = next((p for p in PROGRAMS if exe.startswith(p)), "other")
            per[(name, d)] = ticks
        cpu = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return per, sum(cpu) - cpu[3] - cpu[4]

    @staticmethod
    def cpu_split(before, after, dt):
        """% of one core per program over a window (processes that ended in it are not counted)."""
        out = {}
        for k, t in after[0].items():
            out[k[0]] = out.get(k[0], 0) + (t - before[0].get(k, 0)) / TICK / dt * 100
        out["machine busy"] = (after[1] - before[1]) / TICK / dt * 100
        return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}

    def call_ms(self, node, offset):
        """Per method, the talon handler's ms (p50, p95, max, sum) in node's log after offset."""
        with open(self.talon_log(node), errors="replace") as f:
            f.seek(offset)
            per = {}
            for line in f:
                mm = CALL_MS.search(line)
                if mm:
                    per.setdefault(mm.group(1).rsplit("/", 1)[-1], []).append(int(mm.group(2)))
        return {k: {"n": len(v), "p50": pct(v, 0.5), "p95": pct(v, 0.95), "max": max(v), "sum_s": sum(v) / 1000}
                for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))[:8]}

    def create_attach(self):
        logs = {n: os.path.getsize(self.talon_log(n)) for n in self.s.nodes}
        ticks0 = self.program_ticks()
        t0 = time.monotonic()
        for v in self.vols:
            self.c.custom.create_namespaced_custom_object(GROUP, VERSION, NS, "volumes", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "Volume", "metadata": {"name": v},
                "spec": {"size": str(SIZE), "numberOfReplicas": 2, "dataEngine": "v2", "frontend": "nvmf",
                         "accessMode": "rwo"}})
        created = time.monotonic() - t0
        ticketed, attached, healthy = set(), {}, {}

        def done():
            for va in self.s.list("volumeattachments"):
                v = va["metadata"]["name"]
                if v in self.vols and v not in ticketed:
                    self.s.patch("volumeattachments", v, {"spec": {"attachmentTickets": {"e2e": {
                        "id": "e2e", "type": "longhorn-api", "nodeID": self.s.nodes[0],
                        "parameters": {"disableFrontend": "false"}}}}})
                    ticketed.add(v)
            now = time.monotonic() - t0
            for v, (a, h) in self.health().items():
                if a and v not in attached:
                    attached[v] = now
                if h and v not in healthy:
                    healthy[v] = now
            return len(healthy) == self.n

        try:
            self.s.wait(f"{self.n} volumes attached and healthy", done, 120 + 6 * self.n)
        finally:
            a, h = list(attached.values()), list(healthy.values())
            split = self.cpu_split(ticks0, self.program_ticks(), time.monotonic() - t0)
            calls = {n: self.call_ms(n, logs[n]) for n in self.s.nodes}
            self.phase("attach", create_calls_s=created, attached=len(a), healthy=len(h), cpu_split=split,
                       call_ms=calls,
                       attach_p50=pct(a, 0.5), attach_p95=pct(a, 0.95), attach_last=max(a, default=None),
                       healthy_p50=pct(h, 0.5), healthy_p95=pct(h, 0.95), healthy_last=max(h, default=None))
        lh_say(f"attach: {json.dumps(self.m['phases']['attach'])}")

    def idle_window(self):
        """IDLE s untouched: what the manager's polling costs each node's talon and spdk_tgt."""
        procs = {n: self.pids(n) for n in self.s.nodes}
        logs = {n: os.path.getsize(self.talon_log(n)) for n in self.s.nodes}
        t0 = time.monotonic()
        ticks0 = {n: {k: self.cpu_ticks(p) for k, p in procs[n].items()} for n in self.s.nodes}
        time.sleep(self.idle)
        dt = time.monotonic() - t0
        out = {}
        for n in self.s.nodes:
            cpu = {k: (self.cpu_ticks(p) - ticks0[n][k]) / TICK / dt * 100 for k, p in procs[n].items()}
            with open(self.talon_log(n), errors="replace") as f:
                f.seek(logs[n])
                lines = f.read().splitlines()
            calls = {}
            for line in lines:
                mm = CALL.search(line)
                if mm:
                    calls[mm.group(1)] = calls.get(mm.group(1), 0) + 1
            info = [l for l in lines if " DEBUG " not in l and " TRACE " not in l]
            out[n] = {
                "talon_cpu_pct": cpu["talon"], "spdk_cpu_pct": cpu["spdk_tgt"],
                "talon_rss_mib": self.rss_mib(procs[n]["talon"]), "spdk_rss_mib": self.rss_mib(procs[n]["spdk_tgt"]),
                "heap_mib": self.heap_mib(n),
                "log_bytes_min": sum(len(l) + 1 for l in info) / dt * 60,
                "log_lines_sample": info[:5],
                "calls_s": sum(calls.values()) / dt,
                "calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
            }
        self.phase("idle", seconds=dt, nodes=out)
        lh_say(f"idle: {json.dumps(out)[:3000]}")

    def connected(self):
        """A host connected to every engine (spdk_nvme_perf on core 1, QUEUES I/O queues per
        controller, QD1 4 KiB reads): the heap of the engines' spdk_tgt with and without it."""
        node = self.s.nodes[0]
        before = self.heap_mib(node)
        eps = []
        for e in self.s.list("engines"):
            ep = e.get("status", {}).get("endpoint", "")
            hostport, _, nqn = ep.split("://", 1)[-1].partition("/")
            addr, port = hostport.rsplit(":", 1)
            eps.append(f"trtype:TCP adrfam:IPv4 traddr:{addr} trsvcid:{port} subnqn:{nqn} hostnqn:{HOST_NQN}")
        secs = 12
        argv = [f"{self.s.spdk_dir}/build/bin/spdk_nvme_perf", "--no-huge", "-s", str(256 + 8 * len(eps)),
                "-c", "0x2", "-q", "1", "-o", "4096", "-w", "randread", "-t", str(secs), "-P", str(self.queues)]
        for ep in eps:
            argv += ["-r", ep]
        log = f"{self.c.work}/perf.log"
        with open(log, "w") as out:
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        peak, qpairs, t0 = before, (0, 0), time.monotonic()
        while p.poll() is None and time.monotonic() - t0 < secs + 60:
            time.sleep(2)
            if p.poll() is None:
                heap, q = self.heap_mib(node), self.qpairs(node)
                # the sample with the most qpairs: the host's I/O qpairs go before its admin
                # qpairs when it ends (a sample by admin qpairs alone could find none)
                if sum(q) >= sum(qpairs):
                    qpairs = q
                peak = max(peak, heap)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        text = open(log, errors="replace").read()
        ok = p.returncode == 0
        admin, io = qpairs
        self.phase("connected", heap_before_mib=before, heap_connected_mib=peak, controllers=admin,
                   io_qpairs=io, queues=self.queues, perf_ok=ok, perf_head=text[:1500],
                   per_volume_mib=(peak - before) / admin if admin else None,
                   per_qpair_mib=(peak - before) / (admin + io) if admin else None)
        lh_say(f"connected: {json.dumps(self.m['phases']['connected'])}")

    def qpairs(self, node):
        """(admin, I/O) qpairs connected to node's spdk_tgt (nvmf_get_stats' poll groups)."""
        pod = self.s.im[node]
        sock = f"{self.c.work}/{pod}/run/spdk.sock"
        st = json.loads(lh.run(sys.executable, f"{self.s.spdk_dir}/scripts/rpc.py", "-s", sock,
                               "nvmf_get_stats").stdout)
        groups = st.get("poll_groups", [])
        return (sum(g.get("current_admin_qpairs", 0) for g in groups),
                sum(g.get("current_io_qpairs", 0) for g in groups))

    def boot_storm(self):
        """node 2's talon and spdk_tgt killed (-9); the stand-in kubelet starts talon again at
        once. Every volume must be seen not healthy (the manager noticed), then healthy again."""
        node = self.s.nodes[1]
        pod = self.s.im[node]
        with self.c.lock:
            self.c.pods[f"{NS}/{pod}"]["hold_until"] = 0
        pids = [p for p in self.pids(node).values() if p]
        t0 = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        lh_say(f"kill -9 {pids} (talon and spdk_tgt of {pod})")
        seen_bad, healthy, back = set(), {}, [None]

        def done():
            if back[0] is None:
                ps = self.pids(node)
                if ps["talon"] and ps["spdk_tgt"] and ps["talon"] not in pids:
                    back[0] = time.monotonic() - t0
            now = time.monotonic() - t0
            for v, (_, h) in self.health().items():
                if not h:
                    seen_bad.add(v)
                    healthy.pop(v, None)
                elif v in seen_bad and v not in healthy:
                    healthy[v] = now
            # a volume never seen unhealthy 20 s after node 2's targets are back counts as
            # healthy from the start: the manager's instance watch of node 2 fails at once (its
            # errors are counted below), and its engines on node 1 kept their NVMe paths to node
            # 2's replicas through spdk_tgt's restart (~2 s; runs so far: none degraded). It was
            # 60 s from the kill, the whole step's length
            if back[0] is not None and now > back[0] + 20:
                for v in self.vols:
                    if v not in seen_bad and v not in healthy:
                        healthy[v] = 0.0
            return len(healthy) == self.n

        try:
            self.s.wait(f"{self.n} volumes healthy again after node 2's restart", done, 300 + 6 * self.n)
        finally:
            h = list(healthy.values())
            self.phase("restart", targets_back_s=back[0], degraded=len(seen_bad), healthy=len(h),
                       healthy_p50=pct(h, 0.5), healthy_p95=pct(h, 0.95), healthy_last=max(h, default=None))
        lh_say(f"restart: {json.dumps(self.m['phases']['restart'])}")

    def detach_delete(self):
        t0 = time.monotonic()
        for v in self.vols:
            self.s.patch("volumeattachments", v, {"spec": {"attachmentTickets": {"e2e": None}}})

        def detached():
            vols = {v["metadata"]["name"]: v for v in self.s.list("volumes")}
            return all((vols.get(v) or {}).get("status", {}).get("state") == "detached" for v in self.vols)

        self.s.wait(f"{self.n} volumes detached", detached, 120 + 3 * self.n)
        t_detach = time.monotonic() - t0
        for v in self.vols:
            self.c.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "volumes", v)

        def gone():
            names = set(self.vols)
            return not any(x["metadata"]["name"] in names for x in self.s.list("volumes")) \
                and not self.s.list("engines") and not self.s.list("replicas")

        self.s.wait(f"{self.n} volumes, engines and replicas deleted", gone, 120 + 3 * self.n)
        self.phase("delete", detach_s=t_detach, delete_s=time.monotonic() - t0 - t_detach)

    def nothing_left(self):
        """No lvol on either disk, no subsystem but discovery, no raid or NVMe bdev, no Longhorn
        engine, replica or volume CR, no instance on either instance manager."""
        left = []

        def empty():
            out = []
            for n, pod in self.s.im.items():
                rpc = [sys.executable, f"{self.s.spdk_dir}/scripts/rpc.py", "-s", f"{self.c.work}/{pod}/run/spdk.sock"]
                out += [f"{n}: lvol {x['alias']}" for x in json.loads(lh.run(*rpc, "bdev_lvol_get_lvols").stdout)]
                out += [f"{n}: bdev {b['name']} ({b.get('product_name')})"
                        for b in json.loads(lh.run(*rpc, "bdev_get_bdevs").stdout)
                        if b.get("product_name") in ("Raid Volume", "NVMe disk")]
                out += [f"{n}: subsystem {x['nqn']}" for x in json.loads(lh.run(*rpc, "nvmf_get_subsystems").stdout)
                        if x.get("subtype") != "Discovery"]
                im = self.s.get("instancemanagers", pod).get("status", {})
                for k in ["instanceEngines", "instanceReplicas", "instances"]:
                    out += [f"{n}: {k}/{x}" for x in (im.get(k) or {})]
            for plural in ["volumes", "engines", "replicas", "volumeattachments"]:
                out += [f"{plural[:-1]} {x['metadata']['name']}" for x in self.s.list(plural)
                        if x["metadata"]["name"].startswith("scale-")
                        or x["metadata"].get("labels", {}).get("longhornvolume", "").startswith("scale-")]
            # what a peer race of the scenario before left (its PEER line, driver.instance_gone)
            out = [x for x in out if not any(r in x or (u and u in x) for r, u in self.s.peer_left.items())]
            left[:] = out
            return not out

        try:
            self.s.wait("nothing of the volumes left in SPDK, talon and the cluster", empty, 90)
        except TimeoutError as e:
            raise AssertionError(f"left behind: {left[:40]}") from e

    def write(self, path):
        self.m.pop("_mgr_off", None)
        with open(path, "w") as f:
            json.dump(self.m, f, indent=1)


def lh_say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
