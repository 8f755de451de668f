"""Longhorn's real control plane around talon, with no kubelet and no container runtime.

Everything runs in network namespaces made for the test: a hub (this process moves into it
first) with etcd, the apiserver and a bridge, and one namespace per node on that bridge, where
the node's longhorn-manager, talon and spdk_tgt run (two managers cannot share one: each binds
9500-9503). Pod IPs are addresses on the node's interface.

```text
  hub: etcd 127.0.0.1:2379 <── kube-apiserver 10.250.0.1:6443 (bridge lhbr 10.250.0.0/16)
        (certs and the SA signing key made here)   │ webhooks: ClusterIPs 10.96.0.1x, routed to node 1
  node k (netns, eth0 10.250.k.1 on lhbr)          v (port == targetPort, addresses on node 1's lo)
     longhorn-manager 10.250.k.2   (chroot: /host/{proc,dev,etc}, SA token, /etc/hosts naming the Services)
     instance-manager pod 10.250.k.10.. ──> talon serve (its argv translated) ──> spdk_tgt --no-huge
  stand-in kubelet (a thread): Nodes Ready + Leases, pods Running with their IP, the pod's
     liveness probe on its schedule, restartPolicy Always (a manager or talon that exits starts again)
```

Longhorn's facts used here come from `../shared/longhorn/v1.12.1/README.md` and
longhorn-manager v1.12.1's source (names, ports, the liveness probe).
Nothing is left behind: `Cluster.close()` kills every process in the namespace, deletes it
and detaches the loop devices; `state.json` in the work dir names them for the Rust test's
guard should this process die first.
"""

import ctypes
import datetime
import http.client
import json
import lzma
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time

from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

NS = "longhorn-system"
API_IP = "10.250.0.1"  # the apiserver, on the hub's bridge
NET = "10.250"  # node k: 10.250.k.1 (InternalIP), .2 (its manager pod), .10.. (instance-manager pods)
API_PORT = 6443
# Services the manager and the apiserver reach (types.go, webhook.go); port == targetPort
SERVICES = {
    "longhorn-backend": ("10.96.0.10", 9500),
    "longhorn-conversion-webhook": ("10.96.0.11", 9501),
    "longhorn-admission-webhook": ("10.96.0.12", 9502),
    "longhorn-recovery-backend": ("10.96.0.13", 9503),
}
IMAGE = "longhornio/{}:v1.12.1"
SETTINGS = {
    "v2-data-engine": "true",
    "v1-data-engine": "false",
    "data-engine-hugepage-enabled": '{"v2":"false"}',
    "data-engine-cpu-mask": '{"v2":"0x1"}',
    # no default disk on /var/lib/longhorn: the test registers a block disk itself
    "create-default-disk-labeled-nodes": "true",
    # a failed replica is rebuilt at once (the default waits 600 s for it to come back)
    "replica-replenishment-wait-interval": "0",
}
# The test's NVMe/TCP initiator (spdk_dd): talon exports admit listed hosts only (docs/security.md:
# no any-host export), so the pod's talon.yaml lists it, as a site would its initiators.
HOST_NQN = "nqn.2014-08.org.nvmexpress:uuid:8b1c6d2e-4a51-4e7b-9f0c-2d5e6a7b8c90"
CLONE_NEWNET = 0x40000000
# Where the engine image puts its binary on the host, and where the manager pod sees it (the
# same path, a hostPath mount): some of the manager's threads join the host's mount namespace
# (/host/proc/1/ns/mnt) and look there, so the harness puts it on this machine's path too, and
# removes what it made there when it closes.
ENGINE_BINARIES = "/var/lib/longhorn/engine-binaries"
MANAGER_RESTARTS = 5


def now():
    return datetime.datetime.now(datetime.timezone.utc)


def run(*argv, check=True, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))}: exit {r.returncode}: {r.stderr.strip()}")
    return r


class Dead(RuntimeError):
    """A process the test needs has exited: no use waiting any longer."""


def wait_for(what, fn, timeout, every=0.5, diag=None):
    """fn() until it returns something truthy; a TimeoutError naming `what` (and diag()) after timeout."""
    end, last = time.monotonic() + timeout, None
    while time.monotonic() < end:
        try:
            v = fn()
            if v:
                return v
        except ApiException as e:
            last = f"{e.status} {e.reason}"
        except Dead:
            raise
        except Exception as e:  # noqa: BLE001 (reported if it times out)
            last = repr(e)
        time.sleep(every)
    extra = f"; last error: {last}" if last else ""
    raise TimeoutError(f"{what}: not after {timeout} s{extra}" + (f"\n{diag()}" if diag else ""))


def unpack(xz, dest):
    """The binary of `xz` at `dest`, unpacked once (keyed by the archive's size and mtime)."""
    st = os.stat(xz)
    stamp = f"{dest}.stamp"
    key = f"{st.st_size} {int(st.st_mtime)}"
    if os.path.exists(dest) and os.path.exists(stamp) and open(stamp).read() == key:
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    part = f"{dest}.part.{os.getpid()}"
    with lzma.open(xz) as src, open(part, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    os.chmod(part, 0o755)
    os.replace(part, dest)
    with open(stamp, "w") as f:
        f.write(key)
    return dest


class Cluster:
    def __init__(self, work, longhorn_dir, cache, spdk_dir, talon_bin, log):
        self.work, self.spdk_dir, self.talon_bin, self.log = work, spdk_dir, talon_bin, log
        self.longhorn_dir, self.cache = longhorn_dir, cache
        self.netns = f"talon-lh-e2e-{os.getpid()}"
        self.node_ns = []  # the nodes' namespaces
        self.procs = {}  # name -> Popen
        self.loops = []
        self.made = []  # paths this harness made outside its work dir, removed on close
        self.nodes = {}  # node name -> {"ip", "ns", "k", "next_ip"}
        self.pods = {}  # "ns/name" -> {"ip", "proc", "probe"...}
        self.stop_kubelet = threading.Event()
        self.manager_cmd, self.manager_restarts = {}, {}
        self.kubelet_error = None
        self.lock = threading.Lock()
        os.makedirs(f"{work}/logs", exist_ok=True)

    # ---- bookkeeping -------------------------------------------------------------------------
    def save_state(self):
        with open(f"{self.work}/state.json", "w") as f:
            json.dump({"netns": [self.netns] + self.node_ns, "loops": self.loops, "made": self.made}, f)

    def make_dirs(self, path):
        """os.makedirs outside the work dir, each folder it made recorded (removed on close)."""
        missing = []
        p = path
        while not os.path.exists(p):
            missing.append(p)
            p = os.path.dirname(p)
        for d in reversed(missing):
            os.mkdir(d)
            self.made.append(d)
        if missing:
            self.save_state()

    def logfile(self, name):
        return f"{self.work}/logs/{name}.log"

    def tail(self, name, n=40, width=600, skip=None):
        try:
            with open(self.logfile(name), errors="replace") as f:
                lines = f.readlines()
        except OSError:
            return f"(no log of {name})"
        skip = (skip,) if isinstance(skip, str) else skip or ()
        lines = [line for line in lines if not any(x in line for x in skip)]
        return "".join(line[:width].rstrip() + "\n" for line in lines[-n:])

    def spawn(self, name, argv, env=None, **kw):
        out = open(self.logfile(name), "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, **kw)
        self.procs[name] = p
        self.log(f"started {name} (pid {p.pid})")
        return p

    def stop(self, name, grace=10):
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def alive(self, name):
        p = self.procs.get(name)
        if p is None or p.poll() is not None:
            code = None if p is None else p.returncode
            raise Dead(f"{name} is not running (exit {code}):\n{self.tail(name)}")

    # ---- the namespace -----------------------------------------------------------------------
    def enter_netns(self):
        run("ip", "netns", "add", self.netns)
        self.save_state()
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the test's network namespace")
        os.close(fd)
        run("ip", "link", "set", "lo", "up")
        run("ip", "link", "add", "lhbr", "type", "bridge")
        run("ip", "addr", "add", f"{API_IP}/16", "dev", "lhbr")
        run("ip", "link", "set", "lhbr", "up")
        # the Services' ClusterIPs live on node 1 (its manager serves the webhooks)
        run("ip", "route", "add", "10.96.0.0/24", "via", f"{NET}.1.1")

    def node_netns(self, name):
        """Node k's namespace on the hub's bridge, with its InternalIP and its manager pod's IP."""
        k = len(self.nodes) + 1
        ns = f"{self.netns}-n{k}"
        run("ip", "netns", "add", ns)
        self.node_ns.append(ns)
        self.save_state()
        run("ip", "link", "add", f"lhv{k}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "link", "set", f"lhv{k}", "master", "lhbr", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "-n", ns, "addr", "add", f"{NET}.{k}.1/16", "dev", "eth0")
        run("ip", "-n", ns, "addr", "add", f"{NET}.{k}.2/32", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        if k == 1:
            for ip, _ in SERVICES.values():
                run("ip", "-n", ns, "addr", "add", f"{ip}/32", "dev", "lo")
        else:
            run("ip", "-n", ns, "route", "add", "10.96.0.0/24", "via", f"{NET}.1.1")
        self.nodes[name] = {"ip": f"{NET}.{k}.1", "ns": ns, "k": k, "next_ip": 10}
        return self.nodes[name]

    def in_node(self, node, argv):
        """argv run in `node`'s network namespace."""
        return ["nsenter", f"--net=/run/netns/{self.nodes[node]['ns']}", "--"] + list(argv)

    # ---- etcd, the apiserver and its certificates --------------------------------------------
    def certs(self):
        d = f"{self.work}/pki"
        os.makedirs(d)

        def ossl(*a):
            run("openssl", *a, cwd=d)

        ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-subj", "/CN=talon-e2e-ca", "-days", "2")
        sans = ",".join(
            [f"IP:{ip}" for ip in ["10.96.0.1", API_IP, "127.0.0.1"]]
            + [f"DNS:{n}" for n in ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                                    "kubernetes.default.svc.cluster.local", "localhost"]])
        for name, subj, ext in [("apiserver", "/CN=kube-apiserver", f"subjectAltName={sans}"),
                                ("admin", "/O=system:masters/CN=talon-e2e-admin", None)]:
            ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subj)
            extra = []
            if ext:
                with open(f"{d}/{name}.ext", "w") as f:
                    f.write(ext + "\n")
                extra = ["-extfile", f"{name}.ext"]
            ossl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", *extra)
        ossl("genrsa", "-out", "sa.key", "2048")
        ossl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        self.pki = d

    def start_control_plane(self):
        apiserver = unpack(f"{self.longhorn_dir}/kube-apiserver.xz", f"{self.cache}/kube-apiserver")
        self.spawn("etcd", ["etcd", "--name", "e2e", "--data-dir", f"{self.work}/etcd",
                            "--listen-client-urls", "http://127.0.0.1:2379",
                            "--advertise-client-urls", "http://127.0.0.1:2379",
                            "--listen-peer-urls", "http://127.0.0.1:2380",
                            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                            "--initial-cluster", "e2e=http://127.0.0.1:2380",
                            "--log-level", "warn"])
        p = self.pki
        self.spawn("kube-apiserver", [
            apiserver, "--etcd-servers=http://127.0.0.1:2379", "--bind-address=0.0.0.0",
            f"--secure-port={API_PORT}", f"--advertise-address={API_IP}",
            "--service-cluster-ip-range=10.96.0.0/16", f"--client-ca-file={p}/ca.crt",
            f"--tls-cert-file={p}/apiserver.crt", f"--tls-private-key-file={p}/apiserver.key",
            f"--service-account-key-file={p}/sa.pub", f"--service-account-signing-key-file={p}/sa.key",
            "--service-account-issuer=https://kubernetes.default.svc", "--authorization-mode=AlwaysAllow",
            "--allow-privileged=true",
            f"--cert-dir={self.work}/apiserver", "--profiling=false", "--v=0"])
        cfg = client.Configuration()
        cfg.host = f"https://{API_IP}:{API_PORT}"
        cfg.ssl_ca_cert, cfg.cert_file, cfg.key_file = f"{p}/ca.crt", f"{p}/admin.crt", f"{p}/admin.key"
        self.api = client.ApiClient(cfg)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

        def ready():
            self.alive("kube-apiserver")
            self.alive("etcd")
            ctx = ssl.create_default_context(cafile=f"{p}/ca.crt")
            ctx.load_cert_chain(f"{p}/admin.crt", f"{p}/admin.key")
            conn = http.client.HTTPSConnection(API_IP, API_PORT, context=ctx, timeout=5)
            conn.request("GET", "/readyz")
            return conn.getresponse().status == 200

        wait_for("kube-apiserver ready", ready, 90, diag=lambda: self.tail("kube-apiserver", 20))
        # the kube-node-lease namespace and the kubernetes Service come from the apiserver itself
        wait_for("namespace kube-node-lease", lambda: self.core.read_namespace("kube-node-lease"), 30)

    def apply_crds(self):
        import yaml

        dyn = dynamic.DynamicClient(self.api)
        crds = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
        names = []
        with open(f"{self.longhorn_dir}/longhorn-crds.yaml") as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    crds.server_side_apply(body=doc, field_manager="talon-e2e", force_conflicts=True)
                    names.append(doc["metadata"]["name"])

        def established():
            for n in names:
                c = crds.get(name=n)
                conds = {x["type"]: x["status"] for x in (c.status.conditions or [])}
                if conds.get("Established") != "True":
                    return False
            return True

        wait_for("Longhorn's CRDs established", established, 60)
        return len(names)

    # ---- the objects the manager needs ---------------------------------------------------------
    def bootstrap(self, node_names):
        for n in node_names:
            self.node_netns(n)
        core, apps = self.core, client.AppsV1Api(self.api)
        core.create_namespace({"metadata": {"name": NS}})
        core.create_namespaced_service_account(NS, {"metadata": {"name": "longhorn-service-account"}})
        setting = "".join(f"{k}: '{v}'\n" for k, v in SETTINGS.items())
        core.create_namespaced_config_map(NS, {"metadata": {"name": "longhorn-default-setting"},
                                               "data": {"default-setting.yaml": setting}})
        core.create_namespaced_config_map(NS, {"metadata": {"name": "longhorn-default-resource"},
                                               "data": {"default-resource.yaml": ""}})
        for name, (ip, port) in SERVICES.items():
            sel = "longhorn-manager" if name == "longhorn-backend" else None
            spec = {"clusterIP": ip, "ports": [{"name": "p", "port": port, "targetPort": port}]}
            if sel:
                spec["selector"] = {"app": sel}
            core.create_namespaced_service(NS, {"metadata": {"name": name}, "spec": spec})
        container = {"name": "longhorn-manager", "image": IMAGE.format("longhorn-manager")}
        ds = apps.create_namespaced_daemon_set(NS, {
            "metadata": {"name": "longhorn-manager"},
            "spec": {"selector": {"matchLabels": {"app": "longhorn-manager"}},
                     "template": {"metadata": {"labels": {"app": "longhorn-manager"}},
                                  "spec": {"serviceAccountName": "longhorn-service-account",
                                           "containers": [container]}}}})
        for n in node_names:
            self.create_node(n)
            core.create_namespaced_pod(NS, {
                "metadata": {"name": f"longhorn-manager-{n}", "labels": {"app": "longhorn-manager"},
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                  "name": "longhorn-manager", "uid": ds.metadata.uid,
                                                  "controller": True}]},
                "spec": {"nodeName": n, "serviceAccountName": "longhorn-service-account",
                         "containers": [container]}})
            self.pods[f"{NS}/longhorn-manager-{n}"] = {"ip": f"{NET}.{self.nodes[n]['k']}.2"}

    def create_node(self, name):
        self.core.create_node({"metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}}})
        self.node_status(name)

    def node_status(self, name):
        t = now().isoformat()
        cond = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "stand-in kubelet",
                 "lastHeartbeatTime": t, "lastTransitionTime": t}]
        self.core.patch_node_status(name, {"status": {
            "conditions": cond,
            "addresses": [{"type": "InternalIP", "address": self.nodes[name]["ip"]},
                          {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            "nodeInfo": {"kubeletVersion": "v1.36.2", "kernelVersion": os.uname().release,
                         "osImage": "talon-e2e", "containerRuntimeVersion": "none://0",
                         "architecture": "amd64", "operatingSystem": "linux", "bootID": "e2e",
                         "kubeProxyVersion": "", "machineID": "e2e", "systemUUID": "e2e"}}})
        coord = client.CoordinationV1Api(self.api)
        lease = {"metadata": {"name": name, "namespace": "kube-node-lease"},
                 "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                          "renewTime": now().strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
        try:
            coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": lease["spec"]})
        except ApiException as e:
            if e.status != 404:
                raise
            coord.create_namespaced_lease("kube-node-lease", lease)

    # ---- longhorn-manager, as its DaemonSet pod would run ---------------------------------------
    def start_manager(self, node):
        mgr = unpack(f"{self.longhorn_dir}/longhorn-manager.xz", f"{self.cache}/longhorn-manager")
        sa = f"{self.work}/sa"
        os.makedirs(sa, exist_ok=True)
        tok = self.core.create_namespaced_service_account_token(
            "longhorn-service-account", NS,
            {"spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 86400}})
        for k, v in [("token", tok.status.token), ("namespace", NS),
                     ("ca.crt", open(f"{self.pki}/ca.crt").read())]:
            with open(f"{sa}/{k}", "w") as f:
                f.write(v)
        hosts = f"{self.work}/hosts"
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n")
            f.write("10.96.0.1 kubernetes kubernetes.default kubernetes.default.svc\n")
            for name, (ip, _) in SERVICES.items():
                f.write(f"{ip} {name} {name}.{NS} {name}.{NS}.svc {name}.{NS}.svc.cluster.local\n")
        # the pod's view: a chroot of bind mounts in a mount namespace of its own
        root = f"{self.work}/manager-root-{node}"
        self.make_dirs(ENGINE_BINARIES)
        for d in ["usr", "etc", "proc", "sys", "dev", "tmp", "run", "opt/lh", "var/lib/longhorn/engine-binaries",
                  "host/proc", "host/dev", "host/etc", "host/boot", "host/var/lib/longhorn"]:
            os.makedirs(f"{root}/{d}", exist_ok=True)
        for link in ["bin", "lib", "lib64", "sbin"]:
            if os.path.islink(f"/{link}"):
                os.symlink(os.readlink(f"/{link}"), f"{root}/{link}")
        os.symlink("/run", f"{root}/var/run")
        mounts = [("--rbind", "/usr", "usr"), ("--bind", "/etc", "etc"), ("--bind", hosts, "etc/hosts"),
                  ("--rbind", "/proc", "proc"), ("--rbind", "/sys", "sys"), ("--rbind", "/dev", "dev"),
                  ("--rbind", "/proc", "host/proc"), ("--rbind", "/dev", "host/dev"),
                  ("--bind", "/etc", "host/etc"), ("--bind", os.path.dirname(mgr), "opt/lh"),
                  ("--bind", ENGINE_BINARIES, "var/lib/longhorn/engine-binaries")]
        if os.path.isdir("/boot"):
            mounts.append(("--bind", "/boot", "host/boot"))
        script = ["set -e", "mount --make-rprivate /", f"mount -t tmpfs tmpfs {root}/run",
                  f"mkdir -p {root}/run/secrets/kubernetes.io/serviceaccount"]
        script += [f"mount {how} {src} {root}/{dst}" for how, src, dst in mounts]
        script += [f"mount --bind {sa} {root}/run/secrets/kubernetes.io/serviceaccount",
                   f"exec chroot {root} /opt/lh/longhorn-manager \"$@\""]
        argv = self.in_node(node, ["unshare", "--mount", "--", "sh", "-c", "\n".join(script), "manager",
                "-d", "daemon",
                "--engine-image", IMAGE.format("longhorn-engine"),
                "--instance-manager-image", IMAGE.format("longhorn-instance-manager"),
                "--share-manager-image", IMAGE.format("longhorn-share-manager"),
                "--backing-image-manager-image", IMAGE.format("backing-image-manager"),
                "--support-bundle-manager-image", "longhornio/support-bundle-kit:v0.0.79",
                "--manager-image", IMAGE.format("longhorn-manager"),
                "--service-account", "longhorn-service-account"])
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "POD_NAME": f"longhorn-manager-{node}", "POD_NAMESPACE": NS,
               "POD_IP": f"{NET}.{self.nodes[node]['k']}.2",
               "NODE_NAME": node, "KUBERNETES_SERVICE_HOST": API_IP,
               "KUBERNETES_SERVICE_PORT": str(API_PORT), "HOME": "/tmp"}
        self.manager_cmd[node] = (argv, env)
        self.manager_restarts.setdefault(node, 0)
        self.spawn(f"longhorn-manager-{node}", argv, env=env)

    def restart_managers(self):
        for node in list(self.manager_cmd):
            self.restart_manager(node)

    def restart_manager(self, node):
        """The pod's restartPolicy Always: a manager that exited is started again (v1.12.1 can
        exit at its first start, racing itself on creating a setting: `Error starting manager:
        Operation cannot be fulfilled on settings.longhorn.io "support-bundle-manager-image"`)."""
        name = f"longhorn-manager-{node}"
        p = self.procs.get(name)
        if p is None or p.poll() is None or self.manager_restarts[node] >= MANAGER_RESTARTS:
            return
        last = self.tail(name, 1).strip()
        self.manager_restarts[node] += 1
        self.log(f"kubelet: {name} exited ({p.returncode}: {last}); restart {self.manager_restarts[node]}")
        with open(self.logfile(name), "a") as f:
            f.write(f"--- restart {self.manager_restarts[node]} by the stand-in kubelet ---\n")
        self.spawn(name, *self.manager_cmd[node])

    def manager_alive(self):
        for node, n in self.manager_restarts.items():
            p = self.procs.get(f"longhorn-manager-{node}")
            if p is not None and p.poll() is not None and n >= MANAGER_RESTARTS:
                raise Dead(f"longhorn-manager-{node} exited {n + 1} times:\n"
                           f"{self.tail(f'longhorn-manager-{node}', 20, skip='level=debug')}")

    def start_iscsid(self, node):
        """A process named iscsid: the manager's environment check runs `iscsiadm` in its
        namespaces (the host's mount namespace, where open-iscsi's iscsiadm is)."""
        fake = f"{self.work}/bin/iscsid"
        os.makedirs(os.path.dirname(fake), exist_ok=True)
        if not os.path.exists(fake):
            shutil.copy("/usr/bin/sleep", fake)
        self.spawn(f"iscsid-{node}", self.in_node(node, [fake, "infinity"]))

    # ---- the stand-in kubelet -------------------------------------------------------------------
    def start_kubelet(self):
        t = threading.Thread(target=self._kubelet, name="stand-in-kubelet", daemon=True)
        t.start()
        self.kubelet_thread = t

    def _kubelet(self):
        last_beat = 0.0
        while not self.stop_kubelet.is_set():
            try:
                self.restart_managers()
                self.restart_talons()
                if time.monotonic() - last_beat > 10:
                    for n in list(self.nodes):
                        self.node_status(n)
                    last_beat = time.monotonic()
                self._engine_image_daemonsets()
                for n in list(self.nodes):
                    pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={n}")
                    for pod in pods.items:
                        self._sync_pod(pod)
                self._probe()
            except Exception as e:  # noqa: BLE001 (kept for the test's failure message)
                self.kubelet_error = f"{e!r} {getattr(e, 'body', '')}"
                self.log(f"stand-in kubelet: {self.kubelet_error}")
            self.stop_kubelet.wait(1)

    def _engine_image_daemonsets(self):
        """The DaemonSet controller's part (no kube-controller-manager here) for the engine
        image's DaemonSet that the manager makes: one pod per node, from its template."""
        apps = client.AppsV1Api(self.api)
        for ds in apps.list_namespaced_daemon_set(NS, label_selector="longhorn.io/component=engine-image").items:
            for n in list(self.nodes):
                name = f"{ds.metadata.name}-{self.nodes[n]['k']}"
                try:
                    self.core.read_namespaced_pod(name, NS)
                    continue
                except ApiException as e:
                    if e.status != 404:
                        raise
                spec = self.api.sanitize_for_serialization(ds.spec.template.spec)
                spec["nodeName"] = n
                self.core.create_namespaced_pod(NS, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": NS, "labels": ds.spec.template.metadata.labels,
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                                      "name": ds.metadata.name, "uid": ds.metadata.uid,
                                                      "controller": True, "blockOwnerDeletion": True}]},
                    "spec": spec})
                self.log(f"kubelet: engine image pod {name} made for node {n}")

    def _install_engine_binary(self, pod):
        """What the engine image pod does on its node: puts the image's `longhorn` binary at
        /var/lib/longhorn/engine-binaries/<image, ':' and '/' as '-'>/longhorn (ENGINE_BINARIES),
        where the manager runs it. The image is talon's: talon run
        as `longhorn`. Ready only if the binary answers the pod's readiness check (`longhorn
        version --client-only`)."""
        image = pod.spec.containers[0].image
        cname = image.replace(":", "-").replace("/", "-")
        d = f"{ENGINE_BINARIES}/{cname}"
        self.make_dirs(d)
        dest = f"{d}/longhorn"
        if not os.path.exists(dest):
            try:
                os.link(self.talon_bin, dest)
            except OSError:
                shutil.copy2(self.talon_bin, dest)
        out = run(dest, "version", "--client-only").stdout
        if "clientVersion" not in json.loads(out):
            raise RuntimeError(f"the engine binary {dest}: version --client-only: {out}")
        self.log(f"kubelet: engine binary of {image} installed on {pod.spec.node_name}")

    def _sync_pod(self, pod):
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        c = pod.spec.containers[0]
        args = (c.command or []) + (c.args or [])
        if pod.metadata.deletion_timestamp:
            with self.lock:
                st = self.pods.pop(key, None)
            if st and st.get("proc"):
                self.stop_talon(st["proc"])
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
            self.log(f"kubelet: pod {key} deleted")
            return
        with self.lock:
            st = self.pods.get(key)
        if st is None:
            st = {"ip": None}
            if (pod.metadata.labels or {}).get("longhorn.io/component") == "engine-image":
                self._install_engine_binary(pod)
            if args and args[0] == "start-spdk-tgt":
                node = self.nodes[pod.spec.node_name]
                st["ip"] = f"{NET}.{node['k']}.{node['next_ip']}"
                node["next_ip"] += 1
                run("ip", "-n", node["ns"], "addr", "add", f"{st['ip']}/32", "dev", "eth0")
                st.update(pod=pod.metadata.name, node=pod.spec.node_name, args=args[1:], restarts=0)
                st["proc"] = self.start_talon(pod.metadata.name, pod.spec.node_name, st["ip"], args[1:])
                st["probe"] = pod.spec.containers[0].liveness_probe.to_dict()
                st["started"] = time.monotonic()
                st.update(next_probe=st["started"] + (st["probe"].get("initial_delay_seconds") or 0),
                          failures=0, failed_probes=0, first_failure=None, threshold_reached=False)
            with self.lock:
                self.pods[key] = st
        if pod.status.phase != "Running":
            t = now().isoformat()
            host = self.nodes[pod.spec.node_name]["ip"]
            ip = st["ip"] or host
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
                "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": host, "startTime": t,
                "conditions": [{"type": t_, "status": "True", "lastTransitionTime": t}
                               for t_ in ["PodScheduled", "Initialized", "ContainersReady", "Ready"]],
                "containerStatuses": [{"name": c.name, "image": c.image, "imageID": c.image, "ready": True,
                                       "restartCount": 0, "started": True,
                                       "state": {"running": {"startedAt": t}}}]}})
            self.log(f"kubelet: pod {key} Running at {ip}")

    def start_talon(self, pod, node, ip, pod_args):
        """talon serve with the pod's own arguments translated (talon's `start-spdk-tgt`
        translation, plus the test's dirs, --no-huge and the SPDK dir)."""
        argv = [self.talon_bin, "--socket", f"{self.work}/{pod}/run/talon.sock", "serve"]
        it = iter(pod_args)
        memory = "2048"
        for a in it:
            if a == "--spdk-cpumask":
                argv += ["--spdk-cpumask", next(it)]
            elif a == "--spdk-memory-size":
                memory = next(it)
            elif a == "--listen":
                port = next(it).rsplit(":", 1)[1]
                argv += ["--longhorn-listen", f"{ip}:{port}"]
            elif a == "--spdk-interrupt-mode":
                argv.append("--interrupt-mode")
            elif a in ("--spdk-log", "--spdk-core-number", "--longhorn-control-path",
                       "--spdk-iobuf-large-pool-size", "--spdk-iobuf-small-pool-size"):
                next(it)
        os.makedirs(f"{self.work}/{pod}/data", exist_ok=True)
        os.makedirs(f"{self.work}/{pod}/run", exist_ok=True)
        with open(f"{self.work}/{pod}/talon.yaml", "w") as f:
            f.write(f"node:\n  listenAddress: {ip}\n  allowedHosts: [\"{HOST_NQN}\"]\n")
        argv += ["--data-dir", f"{self.work}/{pod}/data", "--run-dir", f"{self.work}/{pod}/run",
                 "--config", f"{self.work}/{pod}/talon.yaml", "--engine", "v2",
                 "--no-huge", "--no-huge-mem-mib", memory, "--spdk-arg=--disable-cpumask-locks",
                 "--stop-targets-on-exit"]
        # faults a step turns on and off while talon runs (src/util/failpoint.rs, `fault`)
        env = dict(os.environ, TALON_SPDK_DIR=self.spdk_dir, POD_IP=ip, NODE_NAME=node, TALON_LOG=os.environ.get("TALON_E2E_LOG", "info"),
                   NO_COLOR="1", TALON_FAULTS=f"{self.work}/{pod}/faults")
        self.log(f"kubelet: instance-manager pod {pod} on {node} -> {' '.join(argv)}")
        return self.spawn(f"talon-{pod}", self.in_node(node, argv), env=env)

    def restart_talons(self):
        """restartPolicy Always for the instance-manager container: a talon that exited (killed
        by a test step) is started again with the same arguments, as a kubelet would."""
        with self.lock:
            pods = [s for s in self.pods.values() if s.get("proc")]
        for st in pods:
            if st["proc"].poll() is None or time.monotonic() < st.get("hold_until", 0):
                continue
            st["restarts"] += 1
            self.log(f"kubelet: talon of {st['pod']} exited ({st['proc'].returncode}); restart {st['restarts']}")
            st["proc"] = self.start_talon(st["pod"], st["node"], st["ip"], st["args"])

    def stop_talon(self, proc):
        for name, p in list(self.procs.items()):
            if p is proc:
                self.stop(name, grace=30)

    def _liveness(self, st):
        """The pod's liveness probe command, run as the kubelet would, with `localhost` being
        the pod's IP (talon listens on it; a pod has its own loopback, the test does not).
        A real kubelet restarts the container after failureThreshold failures in a row; this
        one records that (`threshold_reached`) and the test fails on it at its end."""
        pr = st["probe"]
        cmd = self.in_node(st["node"], [c.replace("localhost", st["ip"]) for c in pr["_exec"]["command"]])
        try:
            ok = subprocess.run(cmd, capture_output=True, timeout=pr.get("timeout_seconds") or 10).returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        if ok:
            st["failures"] = 0
            return
        st["failures"] += 1
        st["failed_probes"] += 1
        if st["first_failure"] is None:
            ports = [p for p in range(8500, 8505)
                     if subprocess.run(["nc", "-z", "-w", "2", st["ip"], str(p)]).returncode != 0]
            spdk = subprocess.run(["pgrep", "-f", "^spdk_tgt"], capture_output=True).returncode == 0
            st["first_failure"] = (f"{time.monotonic() - st['started']:.0f} s after start: ports not "
                                   f"answering {ports}, a process `^spdk_tgt`: {spdk}")
        if st["failures"] >= (pr.get("failure_threshold") or 3) and not st["threshold_reached"]:
            st["threshold_reached"] = True
            self.log(f"kubelet: liveness probe failed {st['failures']} times in a row: a kubelet would "
                     f"restart the instance-manager container now; first failure {st['first_failure']}")

    def _probe(self):
        with self.lock:
            live = [s for s in self.pods.values() if s.get("probe")]
        for st in live:
            if time.monotonic() >= st["next_probe"]:
                st["next_probe"] = time.monotonic() + (st["probe"].get("period_seconds") or 10)
                self._liveness(st)

    # ---- devices --------------------------------------------------------------------------------
    def loop_device(self, name, size):
        img = f"{self.work}/{name}.img"
        with open(img, "wb") as f:
            f.truncate(size)
        dev = run("losetup", "--find", "--show", img).stdout.strip()
        self.loops.append(dev)
        self.save_state()
        return dev

    # ---- the end ----------------------------------------------------------------------------------
    def close(self):
        self.stop_kubelet.set()
        t = getattr(self, "kubelet_thread", None)
        if t:
            t.join(15)
        for name in [n for n in self.procs if n.startswith("talon-")]:
            self.stop(name, grace=30)
        for name in [n for n in self.procs if n.startswith("longhorn-manager")] + ["kube-apiserver", "etcd"]:
            self.stop(name)
        for name in list(self.procs):
            self.stop(name, grace=3)
        # whatever else runs in the namespace (spdk_tgt of a talon that died, nsenter, ...)
        pids = []
        for ns in [self.netns] + self.node_ns:
            pids += run("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            if pid == str(os.getpid()):
                continue  # this process moved into the namespace itself
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        time.sleep(0.5)
        for dev in self.loops:
            run("losetup", "-d", dev, check=False)
        for ns in self.node_ns + [self.netns]:
            run("ip", "netns", "del", ns, check=False)
        for d in reversed(self.made):
            shutil.rmtree(d, ignore_errors=True)
        os.remove(f"{self.work}/state.json")
