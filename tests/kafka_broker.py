"""Apache Kafka for tests and benchmarks: a single-node KRaft broker (combined broker and
controller) started from the Maven Central jars that tests/kafka_jars.py resolves.

Load it as a plugin (``pytest_plugins = ["kafka_broker"]``) for the session fixture
``kafka_broker``, or use :func:`start_broker` directly (benchmarks, examples). The broker
listens on free loopback ports with a fresh log directory, runs in a process group of its
own and is killed at the end. Where Java or Maven is missing the fixture skips, saying why.

Broker faults for tests: :meth:`Broker.kill` (SIGKILL, the log directory and ports are kept)
then :meth:`Broker.restart`; :meth:`Broker.pause` / :meth:`Broker.resume` (SIGSTOP / SIGCONT).

Readers here are plain confluent-kafka consumers: the independent view of what a topic holds.

Start-up: ``python tests/kafka_broker.py prepare`` resolves the jars and writes a
class-data-sharing archive (``kafka.jsa`` beside the jars) that later starts map instead of
loading ~7,000 classes; it prints the cold and the archived start-up time. Without the
archive the broker starts as well, only slower.
"""
from __future__ import annotations

import base64
import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import kafka_jars  # tests/ is on sys.path: pytest's rootdir, the benchmarks' insert, or this script's folder

#: what the broker's log says once it serves clients (after the broker is unfenced)
READY_LINE = "Kafka Server started"
#: what benchmarks record as the broker their figures come from
BROKER_NAME = f"Apache Kafka {kafka_jars.KAFKA_VERSION} (KRaft, one node on this machine)"
#: the tests' broker JVM: quick to start (the C1 compiler only, the serial collector, a small heap)
JVM_FLAGS = ("-Xms256m", "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")
#: the JVM a user's broker runs in — what Kafka's own start scripts give it
#: (bin/kafka-server-start.sh, bin/kafka-run-class.sh); ``benchmarks/kafka.py --broker-jvm
#: kafka``. On this 2-core machine it took 0.85–1.1 of a core serving a 10 ms-epoch
#: exactly-once run (the JIT and G1's threads), the tests' JVM 0.15–0.2.
KAFKA_JVM_FLAGS = ("-Xms1g", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                   "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
                   "-Djava.awt.headless=true")

_SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs={data_dir}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
transaction.max.timeout.ms=3600000
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
broker.heartbeat.interval.ms=500
broker.session.timeout.ms={session_ms}
"""


# transaction.abort.timed.out.transaction.cleanup.interval.ms: how often the broker looks for
# transactions open past their transaction.timeout.ms (10 s by default): a test of that abort
# waits a second for it, not ten.
# broker.session.timeout.ms: a broker restarted after SIGKILL registers again only once the
# controller expired its old session (DuplicateBrokerRegistrationException until then): 9 s
# by default, which made a restart take 12 s instead of 3-4 s — so a broker that tests restart
# gets 2 s (RESTARTABLE_SESSION_MS). Every other broker keeps Kafka's 9 s: a single node whose
# heartbeats to its own controller are 2 s late (a loaded machine) is fenced by it, every
# partition loses its leader, and open transactions wait out their timeout — a latency
# benchmark run stalled for 60 s so ("Fencing broker 1 at epoch 9 because its session has
# timed out", librdkafka "new leader-1 not found in cache").
RESTARTABLE_SESSION_MS = 2000
DEFAULT_SESSION_MS = 9000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _archive() -> Path:
    return kafka_jars.cache_dir() / "kafka.jsa"


class Broker:
    """A running broker: ``servers`` to connect to, helpers to create, fill and read topics,
    and the process faults tests inject."""

    def __init__(self, home: Path, libs: Path, port: int, controller_port: int,
                 flags: tuple[str, ...] = JVM_FLAGS, restartable: bool = False):
        self.home, self.libs, self.port, self.controller_port = home, libs, port, controller_port
        self.flags = flags  # the broker's JVM (JVM_FLAGS or KAFKA_JVM_FLAGS)
        self.session_ms = RESTARTABLE_SESSION_MS if restartable else DEFAULT_SESSION_MS
        self.data_dir = str(home / "data")
        self.servers = f"127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.started_in: float | None = None  # seconds the last (re)start took until ready

    # --------------------------------------------------------------- process
    def _java(self, main: str, *args: str, extra: tuple[str, ...] = ()) -> list[str]:
        flags = self.flags if main == "kafka.Kafka" else JVM_FLAGS  # (the format tool: quick)
        return ["java", *flags, *extra, f"-Dlog4j2.configurationFile={kafka_jars.LOG4J2_CONFIG}",
                f"-Dkafka.logs.dir={self.home}", "-cp", f"{self.libs}/*", main, *args]

    def format(self) -> None:
        """Write the properties and format the log directory (once, before the first start)."""
        props = self.home / "server.properties"
        props.write_text(_SERVER_PROPERTIES.format(port=self.port, controller_port=self.controller_port,
                                                   session_ms=self.session_ms,
                                                   data_dir=self.data_dir))
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
        # "--cluster-id=": an id may start with "-", which would read as an option
        proc = subprocess.run(self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c",
                                         str(props)),
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"formatting the Kafka log directory {self.data_dir} failed: "
                               f"{(proc.stdout + proc.stderr)[-2000:]}")

    def start(self, timeout: float = 120.0, jvm: tuple[str, ...] | None = None) -> None:
        """Start the broker on its ports and log directory; return once it serves clients.
        Raises RuntimeError with the end of its log if it exits or is not ready in time."""
        assert self.proc is None or self.proc.poll() is not None, "the broker is running"
        if jvm is None:
            jvm = (f"-XX:SharedArchiveFile={_archive()}",) if _archive().exists() else ()
        log = self.home / "server.log"
        offset = log.stat().st_size if log.exists() else 0
        began = time.monotonic()
        with open(self.home / "stdout.log", "ab") as out:
            self.proc = subprocess.Popen(self._java("kafka.Kafka", str(self.home / "server.properties"), extra=jvm),
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = began + timeout
        while True:
            if log.exists():
                with open(log, "rb") as f:
                    f.seek(offset)
                    if READY_LINE.encode() in f.read():
                        break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = (f"exited with {self.proc.returncode}" if self.proc.poll() is not None
                       else f"was not ready within {timeout:.0f} s")
                self._signal(signal.SIGKILL)
                raise RuntimeError(f"the Kafka broker in {self.home} {why}; its log ends:\n{self.log_tail()}")
            time.sleep(0.05)
        self.started_in = time.monotonic() - began
        from confluent_kafka.admin import AdminClient

        AdminClient({"bootstrap.servers": self.servers}).list_topics(timeout=30)

    def log_tail(self, chars: int = 3000) -> str:
        text = ""
        for name in ("server.log", "stdout.log"):
            with contextlib.suppress(OSError):
                text += f"--- {name}\n" + (self.home / name).read_text(errors="replace")[-chars:]
        return text

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            if sig == signal.SIGKILL:
                self.proc.wait(30)

    def kill(self) -> None:
        """SIGKILL the broker (no shutdown of any kind); its log directory and ports stay."""
        self._signal(signal.SIGCONT)  # a paused broker dies at once either way; keep wait() simple
        self._signal(signal.SIGKILL)

    def restart(self, timeout: float = 120.0) -> None:
        """Start again on the same log directory and ports (after :meth:`kill`)."""
        self.kill()
        self.start(timeout)

    def pause(self) -> None:
        """SIGSTOP: the broker holds its connections open and answers nothing."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        """Kill the broker's process group and delete its directory."""
        self.kill()
        shutil.rmtree(self.home, ignore_errors=True)

    # ---------------------------------------------------------------- topics
    def admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.servers})

    def create_topic(self, name: str | None = None, partitions: int = 1) -> str:
        """Create ``name`` (a fresh one by default); return once every partition has a leader."""
        from confluent_kafka.admin import NewTopic

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = self.admin()  # alive until the futures resolved
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(30)
        self._await_leaders(admin, name, partitions)
        return name

    def add_partitions(self, topic: str, total: int) -> None:
        from confluent_kafka.admin import NewPartitions

        admin = self.admin()
        for future in admin.create_partitions([NewPartitions(topic, total)]).values():
            future.result(30)
        self._await_leaders(admin, topic, total)

    def _await_leaders(self, admin, topic: str, partitions: int, timeout: float = 30.0) -> None:
        """Kafka answers CreateTopics before the partitions' leaders are in every metadata
        response, and a leader is in the metadata a moment before it serves requests; wait
        until both hold (every partition's leader answers an offsets request), so a
        producer's first request finds them. (A load generator that started in that moment
        got NOT_LEADER_OR_FOLLOWER and "new leader … not found in cache" thousands of times
        and delivered its records up to a minute late: the latency benchmark measured that.)"""
        deadline = time.monotonic() + timeout
        while True:
            meta = admin.list_topics(topic, timeout=10).topics.get(topic)
            if meta is not None and meta.error is None and len(meta.partitions) >= partitions and all(
                    p.leader >= 0 for p in meta.partitions.values()):
                self.end_offsets(topic, committed=False, timeout=max(1.0, deadline - time.monotonic()))
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {topic}: {partitions} partitions without leaders after {timeout} s")
            time.sleep(0.05)

    def produce(self, topic: str, values, *, partition: int | None = None, key=None, timestamps=None) -> None:
        """Produce ``values`` (str or bytes) and wait until every one is acknowledged."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.servers, "linger.ms": 5})
        failed = []
        for i, value in enumerate(values):
            kwargs = {}
            if partition is not None:
                kwargs["partition"] = partition
            if timestamps is not None:
                kwargs["timestamp"] = timestamps[i]
            while True:
                try:
                    producer.produce(topic, value.encode() if isinstance(value, str) else value, key,
                                     on_delivery=lambda err, msg: failed.append(err) if err else None, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
        left = producer.flush(60)
        assert left == 0 and not failed, f"produce to {topic}: {left} undelivered, errors {failed[:3]}"

    def end_offsets(self, topic: str, committed: bool = True, timeout: float = 30.0) -> dict[int, int]:
        """Per partition: the last stable offset (``committed``) or the log end offset.
        Retriable errors are retried until ``timeout``: a partition just created is in the
        metadata a moment before its leader answers offset requests (NOT_LEADER_FOR_PARTITION)."""
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

        c = Consumer({"bootstrap.servers": self.servers, "group.id": f"ends-{uuid.uuid4().hex[:8]}",
                      "isolation.level": "read_committed" if committed else "read_uncommitted"})
        deadline = time.monotonic() + timeout
        try:
            n = len(self.admin().list_topics(topic, timeout=10).topics[topic].partitions)
            ends = {}
            for p in range(n):
                while p not in ends:
                    try:
                        ends[p] = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    except KafkaException as exc:
                        err = exc.args[0]
                        # librdkafka marks NOT_LEADER non-retriable here; for a new topic it is transient
                        transient = err.retriable() or err.code() in (
                            KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                            KafkaError.UNKNOWN_TOPIC_OR_PART)
                        if not transient or time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
            return ends
        finally:
            c.close()

    def open_transactions(self, topic: str) -> dict[int, int]:
        """Partitions whose last stable offset lags the log end: a transaction is open there."""
        stable, end = self.end_offsets(topic, True), self.end_offsets(topic, False)
        return {p: end[p] - stable[p] for p in end if end[p] != stable[p]}

    def read_committed(self, topic: str, timeout: float = 30.0) -> dict[int, list]:
        """Every record a read_committed consumer sees, per partition in offset order, as
        ``(offset, key, value)`` with bytes. Reads from offset 0 up to the last stable offset."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        ends = self.end_offsets(topic, True)
        c = Consumer({"bootstrap.servers": self.servers, "group.id": f"read-{uuid.uuid4().hex[:8]}",
                      "isolation.level": "read_committed", "enable.partition.eof": True,
                      "enable.auto.commit": False})
        out: dict[int, list] = {p: [] for p in ends}
        try:
            c.assign([TopicPartition(topic, p, 0) for p in ends])
            done = {p for p, e in ends.items() if e == 0}
            deadline = time.monotonic() + timeout
            while len(done) < len(ends):
                if time.monotonic() > deadline:
                    raise AssertionError(f"reading {topic}: partitions {sorted(set(ends) - done)} did not reach "
                                         f"their last stable offsets {ends} within {timeout} s")
                msg = c.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= ends[msg.partition()]:
                            done.add(msg.partition())
                        continue
                    raise AssertionError(f"reading {topic}: {msg.error()}")
                out[msg.partition()].append((msg.offset(), msg.key(), msg.value()))
                if msg.offset() + 1 >= ends[msg.partition()]:
                    done.add(msg.partition())
        finally:
            c.close()
        return out

    def values(self, topic: str) -> list[bytes]:
        """Every committed value of ``topic`` (all partitions)."""
        return [v for records in self.read_committed(topic).values() for _, _, v in records]


def cannot_start_broker() -> str | None:
    """Why no broker can start here (no Java, no Maven, no confluent-kafka), or None."""
    why = kafka_jars.missing_tools()
    if why:
        return why
    with contextlib.suppress(ImportError):
        import confluent_kafka  # noqa: F401

        return None
    return "confluent-kafka is not installed (pip install -e '.[test]')"


def start_broker(timeout: float = 120.0, jvm: tuple[str, ...] | None = None,
                 flags: tuple[str, ...] = JVM_FLAGS, restartable: bool = False) -> Broker:
    """Resolve the jars if needed, then format and start a broker on free loopback ports.
    ``flags``: its JVM — the tests' quick one, or :data:`KAFKA_JVM_FLAGS` (benchmarks).
    ``restartable``: the test will SIGKILL and restart it (a short broker session, see
    :data:`RESTARTABLE_SESSION_MS`)."""
    libs = kafka_jars.resolve()
    for attempt in range(5):  # another process may take a port between the probe and the bind
        broker = Broker(Path(tempfile.mkdtemp(prefix="epochal-kafka-")), libs, _free_port(), _free_port(), flags,
                        restartable)
        try:
            broker.format()
            broker.start(timeout, jvm)
            return broker
        except RuntimeError:
            bind_failed = "Address already in use" in broker.log_tail(20000)
            broker.stop()
            if not bind_failed or attempt == 4:
                raise
    raise AssertionError("unreachable")


def prepare() -> None:
    """Resolve the jars; write the class-data-sharing archive if it is missing (a start that
    lists the classes it loads, then ``java -Xshare:dump``, renamed into place). Idempotent."""
    libs = kafka_jars.resolve()
    print(f"jars: {libs}")
    if _archive().exists():
        print(f"archive: {_archive()} (exists)")
        return
    classes = Path(tempfile.mkdtemp(prefix="cds-", dir=_archive().parent))
    try:
        broker = start_broker(jvm=(f"-XX:DumpLoadedClassList={classes}/classes.lst",))
        print(f"cold start: {broker.started_in:.1f} s")
        broker.stop()
        tmp = classes / "kafka.jsa"
        proc = subprocess.run(["java", "-Xshare:dump", "-XX:+UseSerialGC", f"-XX:SharedClassListFile={classes}/classes.lst",
                               f"-XX:SharedArchiveFile={tmp}", "-cp", f"{libs}/*"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"writing the CDS archive failed: {(proc.stdout + proc.stderr)[-2000:]}")
        tmp.rename(_archive())
    finally:
        shutil.rmtree(classes, ignore_errors=True)
    broker = start_broker()
    print(f"archive: {_archive()}; start with it: {broker.started_in:.1f} s")
    broker.stop()


@pytest.fixture(scope="session")
def kafka_broker():
    why = cannot_start_broker()
    if why:
        pytest.skip(why)
    broker = start_broker()
    yield broker
    _let_clients_go()
    broker.stop()


def _let_clients_go(timeout: float = 10.0) -> None:
    """Before the session broker stops: wait for the Kafka sinks' idle commit threads to exit
    (epochal/connectors/kafka/committer.py: a thread holds its writer, and the writer its
    producers and consumers), then collect, so the clients tests dropped close now — each one
    still alive after the broker is gone logs "Connect ... refused" for as long as it lives."""
    import threading

    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith("kafka-commit-"):
            thread.join(max(0.0, deadline - time.monotonic()))
    gc.collect()


if __name__ == "__main__":
    if sys.argv[1:] != ["prepare"]:
        sys.exit("usage: python tests/kafka_broker.py prepare")
    why = cannot_start_broker()
    if why:
        sys.exit(why)
    prepare()
