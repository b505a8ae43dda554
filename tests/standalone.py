"""A real multi-host Spark standalone cluster on this machine, for tests and benchmarks.

Hosts are Linux network namespaces joined by a bridge (DESIGN.md "Facts"): the Spark
``Master``, the S3-compatible server (moto) and the drivers live in the root namespace
on the bridge address ``10.77.<n>.1``; each ``Worker`` — and so its executor JVM and every
Python worker it forks — lives in its own namespace ``10.77.<n>.<2+i>``. Killing every
process of a namespace is the loss of a whole host.

Load it as a plugin (``pytest_plugins = ["standalone"]``) for the session fixture
``standalone_cluster``; it skips, saying why, where namespaces cannot be created (not
root, no ``ip``). Benchmarks use :func:`start_cluster` directly.

Everything the cluster starts is killed and every namespace and link it created is deleted
at the end, also when a test fails.

Spark's RPC is authenticated and encrypted (a random secret shared by the master, the workers
and the drivers): epochal refuses a cluster without it. Drivers started by
:meth:`StandaloneCluster.start_driver` find the settings in ``EPOCHAL_TEST_SPARK_CONF`` (JSON),
``spark-submit`` gets them from :attr:`StandaloneCluster.spark_conf`.

Every JVM of the cluster (master, workers, drivers, executors) runs with :data:`FAST_JVM`:
two busy cores host all of them, and a JVM's start-up — mostly the JIT compiling Spark's
classes — is what the cluster tests wait for most (executors of three drivers starting at
once took 40–60 s). The options change how fast the JVM starts, not what Spark does.
"""
from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import pytest

#: JVM options of every cluster JVM: the client compiler only, the serial collector (the
#: embedded session's LOCAL_JAVA_OPTIONS, without its class-data archive)
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
S3_BUCKET = "epochal-cluster"
S3_KEY = S3_SECRET = "testing"
REGION = "us-east-1"
#: environment variable holding the Spark settings a driver needs (JSON; :func:`driver_conf`)
SPARK_CONF_ENV = "EPOCHAL_TEST_SPARK_CONF"


def driver_conf() -> dict:
    """The Spark settings a driver of the test cluster needs (empty outside one)."""
    return json.loads(os.environ.get(SPARK_CONF_ENV, "{}"))


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def cannot_create_hosts() -> str | None:
    """Why this machine cannot host the cluster, or None if it can."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java for the Spark master and workers"
    return None


def sweep_stale_hosts() -> None:
    """Delete the namespaces and links of clusters whose processes are all gone (a test run
    killed before its teardown): ``ep<n>w<i>`` namespaces without processes, then bridges
    ``ep<n>br`` without any attached link."""
    import re

    for ns in _run("ip", "netns", "list", check=False).stdout.split("\n"):
        name = ns.split(" ")[0]
        if re.fullmatch(r"ep\d+w\d+", name) and not _run("ip", "netns", "pids", name, check=False).stdout.split():
            _run("ip", "netns", "del", name, check=False)
    links = _run("ip", "-o", "link", "show", check=False).stdout
    for bridge in set(re.findall(r"\d+: (ep\d+br)[:@]", links)):
        if f"master {bridge} " not in links:
            _run("ip", "link", "del", bridge, check=False)


def _free_subnet() -> int:
    used = _run("ip", "-o", "-4", "addr", "show").stdout
    for n in [os.getpid() % 200 + 20] + list(range(20, 250)):
        if f"10.77.{n}." not in used:
            return n
    raise RuntimeError("no free 10.77.x.0/24 subnet for the test cluster")


@dataclass
class Host:
    """One worker host: a network namespace with one Spark Worker."""

    name: str  # namespace
    address: str
    workdir: str
    cores: int
    memory: str
    worker: subprocess.Popen | None = None

    def pids(self) -> list[int]:
        out = _run("ip", "netns", "pids", self.name, check=False).stdout
        return [int(p) for p in out.split()]

    def task_processes(self) -> dict[int, str]:
        """``pid → task`` of the epochal task processes running on this host (their
        ``/proc/<pid>/comm`` is ``"ep <task id>"``, see ``epochal.runtime.launch.worker``)."""
        found = {}
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if comm.startswith("ep "):
                found[pid] = comm[3:]
        return found


@dataclass
class StandaloneCluster:
    """A running cluster: ``master_url``, the driver/bridge address ``driver_host``, the
    worker ``hosts`` and an S3 endpoint every host reaches."""

    subnet: int
    bridge: str
    driver_host: str
    master_url: str
    hosts: list[Host]
    root: str
    s3_endpoint: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    drivers: list[subprocess.Popen] = field(default_factory=list)
    _moto: object = None
    #: Spark's RPC secret: the master, the workers and every driver authenticate with it
    #: and encrypt their RPC (what epochal requires on a cluster, epochal.runtime.launch.spark)
    rpc_secret: str = field(default_factory=lambda: os.urandom(16).hex(), repr=False)

    @property
    def spark_conf(self) -> dict:
        """The driver settings this cluster needs: authenticated, encrypted Spark RPC."""
        return {"spark.authenticate": "true", "spark.authenticate.secret": self.rpc_secret,
                "spark.network.crypto.enabled": "true",
                "spark.driver.extraJavaOptions": FAST_JVM, "spark.executor.extraJavaOptions": FAST_JVM}

    @property
    def daemon_env(self) -> dict:
        """Environment of the master and the workers: the same secret, RPC authenticated."""
        return {"SPARK_DAEMON_JAVA_OPTS": f"{FAST_JVM} -Dspark.authenticate=true "
                                          f"-Dspark.authenticate.secret={self.rpc_secret}"}

    # ------------------------------------------------------------------ S3
    @property
    def s3_env(self) -> dict:
        return {"AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_ACCESS_KEY_ID": S3_KEY,
                "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def fresh_s3_url(self, name: str) -> str:
        import uuid

        return f"s3://{S3_BUCKET}/{name}-{uuid.uuid4().hex[:8]}"

    def s3_fs(self):
        import s3fs

        return s3fs.S3FileSystem(key=S3_KEY, secret=S3_SECRET, endpoint_url=self.s3_endpoint,
                                 client_kwargs={"region_name": REGION})

    def completed_epochs(self, storage_url: str, job: str) -> list[int]:
        """Epochs with a ``_metadata`` under ``<storage>/<job>`` — read straight from S3."""
        fs = self.s3_fs()
        root = storage_url.removeprefix("s3://") + f"/{job}"
        fs.invalidate_cache()
        return sorted(int(p.rsplit("/", 2)[-2][4:]) for p in fs.glob(f"{root}/chk-*/_metadata"))

    # ------------------------------------------------------------------ drivers
    def driver_env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(self.s3_env)
        env.update({"SPARK_LOCAL_IP": self.driver_host, "PYSPARK_PYTHON": sys.executable,
                    "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_HOME": spark_home(),
                    SPARK_CONF_ENV: json.dumps(self.spark_conf)})
        env.update(extra)
        return env

    def start_driver(self, args: list[str], log_path: str, env: dict | None = None) -> subprocess.Popen:
        """Start ``python <args>`` (a driver script) in the root namespace, output to ``log_path``."""
        log = open(log_path, "wb")
        proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                env=env or self.driver_env(), start_new_session=True)
        log.close()
        self.drivers.append(proc)
        return proc

    # ------------------------------------------------------------------ hosts
    def host(self, i: int) -> Host:
        return self.hosts[i]

    def kill_host(self, i: int) -> list[int]:
        """SIGKILL every process of host ``i`` (Worker, executor JVM, Python daemon and
        workers): the host is gone. Returns the pids killed."""
        h = self.hosts[i]
        pids = h.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while h.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        if h.worker is not None:
            with contextlib.suppress(Exception):
                h.worker.wait(5)
        return pids

    def partition_host(self, i: int) -> None:
        """Pull host ``i``'s network cable: its bridge port goes down, so nothing it sends
        or is sent reaches anybody. No process dies and no connection is reset — the
        host just stops answering (a silent host loss, unlike :meth:`kill_host`)."""
        _run("ip", "link", "set", f"ep{self.subnet}v{i + 1}", "down")

    def heal_host(self, i: int) -> None:
        """Plug host ``i``'s cable back in (undo :meth:`partition_host`)."""
        _run("ip", "link", "set", f"ep{self.subnet}v{i + 1}", "up")

    def start_worker(self, i: int) -> None:
        h = self.hosts[i]
        os.makedirs(h.workdir, exist_ok=True)
        log = open(os.path.join(self.root, f"{h.name}-worker.log"), "ab")
        env = dict(os.environ, SPARK_LOCAL_IP=h.address, SPARK_HOME=spark_home(),
                   SPARK_WORKER_DIR=h.workdir, **self.daemon_env)
        h.worker = subprocess.Popen(
            ["ip", "netns", "exec", h.name, os.path.join(spark_home(), "bin", "spark-class"),
             "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", h.address,
             "--cores", str(h.cores), "--memory", h.memory, "--work-dir", h.workdir, "--webui-port", "0"],
            stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        self.processes.append(h.worker)

    def wait_registered(self, n: int | None = None, timeout: float = 90) -> None:
        """Wait until ``n`` (default: all) workers are ALIVE at the master (its JSON page)."""
        import urllib.request

        n = len(self.hosts) if n is None else n
        deadline = time.monotonic() + timeout
        alive, last = 0, None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.driver_host}:{self.master_ui_port}/json/",
                                            timeout=2) as r:
                    state = json.load(r)
                alive = sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")
                if alive >= n:
                    return
            except (OSError, ValueError) as exc:  # not up yet, or a starting UI answering HTML
                last = exc
            time.sleep(0.5)
        raise TimeoutError(f"only {alive} of {n} Spark workers registered within {timeout} s (last answer: "
                           f"{last!r}); see {self.root}/*.log")

    master_ui_port: int = 0

    def logs(self) -> list[str]:
        """Every log file the cluster's processes wrote (master, workers, executors)."""
        found = glob.glob(os.path.join(self.root, "*.log"))
        for h in self.hosts:
            found += [p for p in glob.glob(os.path.join(h.workdir, "**", "*"), recursive=True) if os.path.isfile(p)]
        return found


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def start_cluster(workers: int = 2, cores: int = 8, memory: str = "3g", root: str | None = None):
    """Create the hosts, start moto S3, the Master and ``workers`` Workers; yield the
    :class:`StandaloneCluster`; tear everything down afterwards."""
    why = cannot_create_hosts()
    if why:
        raise RuntimeError(why)
    sweep_stale_hosts()
    n = _free_subnet()
    tag = f"ep{n}"
    bridge = f"{tag}br"
    driver_host = f"10.77.{n}.1"
    root = root or tempfile.mkdtemp(prefix="epochal-cluster-")
    created_ns: list[str] = []
    cluster = None
    moto = None
    try:
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{driver_host}/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        hosts = []
        for i in range(workers):
            ns, veth, addr = f"{tag}w{i + 1}", f"{tag}v{i + 1}", f"10.77.{n}.{i + 2}"
            _run("ip", "netns", "add", ns)
            created_ns.append(ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            hosts.append(Host(ns, addr, os.path.join(root, ns), cores, memory))

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        moto = ThreadedMotoServer(ip_address=driver_host, port=_free_port(driver_host), verbose=False)
        moto.start()
        mhost, mport = moto.get_host_and_port()
        master_port, ui_port = _free_port(driver_host), _free_port(driver_host)
        cluster = StandaloneCluster(n, bridge, driver_host, f"spark://{driver_host}:{master_port}", hosts, root,
                                    f"http://{mhost}:{mport}", _moto=moto)
        cluster.master_ui_port = ui_port
        import boto3

        boto3.client("s3", endpoint_url=cluster.s3_endpoint, aws_access_key_id=S3_KEY,
                     aws_secret_access_key=S3_SECRET, region_name=REGION).create_bucket(Bucket=S3_BUCKET)

        log = open(os.path.join(root, "master.log"), "ab")
        master = subprocess.Popen(
            [os.path.join(spark_home(), "bin", "spark-class"), "org.apache.spark.deploy.master.Master",
             "--host", driver_host, "--port", str(master_port), "--webui-port", str(ui_port)],
            stdout=log, stderr=subprocess.STDOUT,
            env=dict(os.environ, SPARK_LOCAL_IP=driver_host, SPARK_HOME=spark_home(), **cluster.daemon_env))
        log.close()
        cluster.processes.append(master)
        for i in range(workers):
            cluster.start_worker(i)
        cluster.wait_registered()
        yield cluster
    finally:
        if cluster is not None:
            for proc in cluster.drivers:  # each in its own session: its JVM goes with it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            for proc in cluster.processes:
                if proc.poll() is None:
                    proc.kill()
            for i in range(len(cluster.hosts)):
                cluster.kill_host(i)
            for proc in cluster.processes + cluster.drivers:
                with contextlib.suppress(Exception):
                    proc.wait(10)
        if moto is not None:
            moto.stop()
        for ns in created_ns:
            _run("ip", "netns", "del", ns, check=False)
        for i in range(len(created_ns)):
            _run("ip", "link", "del", f"{tag}v{i + 1}", check=False)
        _run("ip", "link", "del", bridge, check=False)


@pytest.fixture(scope="session")
def standalone_cluster():
    """A two-host Spark standalone cluster (8 cores and 3 GB per worker) with S3 on the
    bridge; skipped, with the reason, where namespaces cannot be created."""
    why = cannot_create_hosts()
    if why:
        pytest.skip(f"standalone cluster: {why}")
    with start_cluster() as cluster:
        yield cluster


@pytest.fixture
def s3(standalone_cluster, monkeypatch):
    """The cluster, with this process reading its S3 (outputs, checkpoints) through the
    environment."""
    for k, v in standalone_cluster.s3_env.items():
        monkeypatch.setenv(k, v)
    return standalone_cluster
