"""What the Kafka source and sink share: the client library, its configuration, and the
questions both ask the brokers before a job starts (reachable? does the topic exist?).

confluent-kafka (librdkafka) is an optional extra: :func:`kafka` imports it on first use
and says how to install it, so ``import epochal`` never needs it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from epochal.errors import ConfigError

#: how long the driver waits for the brokers' metadata before a job starts
METADATA_TIMEOUT_S = 10.0

_TOPIC = re.compile(r"^[A-Za-z0-9._\-]{1,249}$")


def kafka():
    """The ``confluent_kafka`` module, or ConfigError naming the extra to install."""
    try:
        import confluent_kafka
    except ImportError:  # pragma: no cover - the test extra installs it
        raise ConfigError("Kafka connectors need confluent-kafka: pip install 'epochal[kafka]'") from None
    return confluent_kafka


def check_servers(bootstrap_servers, what: str) -> str:
    """``bootstrap_servers`` as librdkafka's comma-separated ``host:port`` list."""
    if isinstance(bootstrap_servers, (list, tuple)):
        bootstrap_servers = ",".join(str(s) for s in bootstrap_servers)
    if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
        raise ConfigError(f"{what} bootstrap_servers: expected 'host:port[,host:port...]', got {bootstrap_servers!r}")
    return bootstrap_servers.strip()


def check_topic(topic, what: str) -> str:
    if not isinstance(topic, str) or not _TOPIC.match(topic):
        raise ConfigError(f"{what} topic: expected a Kafka topic name (letters, digits, '.', '_', '-'; at most "
                          f"249), got {topic!r}")
    return topic


def client_config(bootstrap_servers: str, config: Mapping | None, what: str, *, reserved: tuple[str, ...] = (),
                  defaults: Mapping | None = None) -> dict:
    """librdkafka configuration: ``defaults``, then the user's ``config``, then the servers.

    Keys in ``reserved`` are set by epochal itself (e.g. ``transactional.id``): a user value
    for them is refused, naming the key, instead of being silently overridden.
    """
    if config is not None and not isinstance(config, Mapping):
        raise ConfigError(f"{what} config: expected a dict of librdkafka settings, got {type(config).__name__}")
    merged = dict(defaults or {})
    for key, value in (config or {}).items():
        if not isinstance(key, str):
            raise ConfigError(f"{what} config: keys must be librdkafka setting names, got {key!r}")
        if key in reserved:
            raise ConfigError(f"{what} config[{key!r}]: set by epochal (it manages {key} to keep its guarantee); "
                              "remove it")
        merged[key] = value
    merged["bootstrap.servers"] = bootstrap_servers
    return merged


def describe_error(exc: BaseException) -> str:
    """A librdkafka exception as one line: ``NAME: reason``."""
    args = getattr(exc, "args", ())
    err = args[0] if args else None
    if err is not None and hasattr(err, "name") and hasattr(err, "str"):
        return f"{err.name()}: {err.str()}"
    return f"{type(exc).__name__}: {exc}"


def list_topics(config: dict, what: str, timeout: float = METADATA_TIMEOUT_S) -> dict:
    """``{topic: number of partitions}`` of every topic the brokers report.

    Lists *all* topics: a metadata request naming one topic makes brokers with
    ``auto.create.topics.enable`` create it, which would hide a misspelled topic.

    Raises:
        ConfigError: the brokers did not answer within ``timeout`` (naming the servers).
    """
    ck = kafka()
    from confluent_kafka.admin import AdminClient

    admin_conf = {k: v for k, v in config.items() if k in _ADMIN_KEYS or k.startswith(("security.", "sasl.", "ssl."))}
    admin_conf["bootstrap.servers"] = config["bootstrap.servers"]
    admin = AdminClient(admin_conf)
    try:
        meta = admin.list_topics(timeout=timeout)
    except ck.KafkaException as exc:
        raise ConfigError(f"{what}: cannot reach the Kafka brokers at {config['bootstrap.servers']} within "
                          f"{timeout:.0f} s ({describe_error(exc)}); is the broker running and the address "
                          "right?") from None
    return {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}


def require_topics(config: dict, topics: list[str], what: str) -> dict:
    """``{topic: partitions}`` for ``topics``; ConfigError naming any that does not exist."""
    found = list_topics(config, what)
    missing = [t for t in topics if t not in found]
    if missing:
        raise ConfigError(f"{what}: topic(s) {missing} do not exist on {config['bootstrap.servers']}; create "
                          f"them first (existing: {sorted(t for t in found if not t.startswith('__'))[:20]})")
    return {t: found[t] for t in topics}


_ADMIN_KEYS = {"client.id", "socket.timeout.ms", "metadata.max.age.ms", "broker.address.family",
               "socket.connection.setup.timeout.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms"}
