import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpcdc_toolkit import ConfigError, load_config
from gpcdc_toolkit.capture._processes import CaptureGroup, config_environment
from gpcdc_toolkit.capture._worker import WorkerSettings
from gpcdc_toolkit.cli import build_parser
from gpcdc_toolkit.config import GUARDED_CLIENT_SETTINGS, SETTINGS, CaptureSettings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpcdc.toml"
    path.write_text(text)
    return path


def test_defaults_name_the_embedded_setup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config({}, environ={})
    assert config.source.sandbox == "source" and config.source.dsn is None
    assert config.target.sandbox == "target"
    assert config.kafka.bootstrap_servers is None
    assert config.work_dir == tmp_path / ".gpcdc"


def test_flags_beat_environment_beat_file(tmp_path):
    path = write(tmp_path, '[kafka]\ntopic_prefix = "from-file"\nbootstrap_servers = "file:9092"\n[spark]\nmaster = "local[1]"\n')
    config = load_config(
        {"kafka.topic_prefix": "from-flag"},
        config_file=path,
        environ={"GPCDC_KAFKA_TOPIC_PREFIX": "from-env", "GPCDC_KAFKA_BOOTSTRAP_SERVERS": "env:9092"},
    )
    assert config.kafka.topic_prefix == "from-flag"
    assert config.kafka.bootstrap_servers == "env:9092"
    assert config.spark.master == "local[1]"
    assert config.origins["kafka.topic_prefix"] == "flag --kafka-topic-prefix"
    assert config.origins["kafka.bootstrap_servers"] == "environment GPCDC_KAFKA_BOOTSTRAP_SERVERS"
    assert config.origins["spark.master"] == "file"


def test_client_settings_table_passes_through(tmp_path):
    path = write(tmp_path, '[kafka.client]\n"security.protocol" = "SASL_SSL"\n"linger.ms" = 5\n')
    config = load_config({}, config_file=path, environ={})
    assert config.kafka.client == {"security.protocol": "SASL_SSL", "linger.ms": "5"}


@given(st.sets(st.sampled_from(sorted(GUARDED_CLIENT_SETTINGS)), min_size=1),
       st.dictionaries(st.sampled_from(["linger.ms", "security.protocol", "client.id"]), st.text(
           st.characters(codec="ascii", exclude_categories=("Cc",)).filter(lambda c: c not in '"\\'), max_size=8)))
@settings(max_examples=30, deadline=None)
def test_client_settings_that_capture_fixes_are_refused_by_name(tmp_path_factory, guarded, others):
    table = {**others, **{name: "0" for name in guarded}}
    path = write(tmp_path_factory.mktemp("guarded"), "[kafka.client]\n" + "".join(
        f'"{k}" = "{v}"\n' for k, v in table.items()))
    with pytest.raises(ConfigError) as raised:
        load_config({}, config_file=path, environ={})
    message = str(raised.value)
    assert "\n" not in message and f"remove {', '.join(sorted(guarded))} from [kafka.client]" in message
    assert not any(f" {name}" in message.split("sets ", 1)[1] for name in others)


def test_the_producer_waits_for_kafka_rather_than_leave_a_gap():
    from gpcdc_toolkit.capture._worker import DELIVERY_GUARANTEES, producer_config

    assert set(DELIVERY_GUARANTEES) <= GUARDED_CLIENT_SETTINGS
    config = producer_config(WorkerSettings(kafka={"linger.ms": "1"}, capture=CaptureSettings(), prefix="p",
                                            replicas=0))
    assert config["message.timeout.ms"] == 0 and config["enable.gapless.guarantee"] is True
    assert config["acks"] == "all" and config["enable.idempotence"] is True


def test_the_producer_compresses_with_lz4_unless_kafka_client_chooses_otherwise(tmp_path):
    from gpcdc_toolkit.capture._worker import producer_config
    from gpcdc_toolkit.connect import kafka_client_settings

    def compression(file_text):
        path = tmp_path / "gpcdc.toml"
        path.write_text(file_text)
        config = load_config({"kafka.bootstrap_servers": "127.0.0.1:9"}, config_file=path, environ={})
        settings = WorkerSettings(kafka=kafka_client_settings(config), capture=CaptureSettings(), prefix="p", replicas=0)
        return producer_config(settings)["compression.type"]

    assert compression("") == "lz4"
    assert compression('[kafka.client]\n"compression.type" = "none"\n') == "none"
    assert compression('[kafka.client]\n"compression.type" = "zstd"\n') == "zstd"


def test_the_producer_refreshes_partition_leaders_within_seconds_unless_kafka_client_says_otherwise():
    from gpcdc_toolkit.capture._worker import producer_config

    def refresh(client):
        settings = WorkerSettings(kafka=client, capture=CaptureSettings(), prefix="p", replicas=0)
        return int(producer_config(settings)["topic.metadata.refresh.interval.ms"])

    assert refresh({}) <= 10_000  # librdkafka's default, 5 minutes, is how long a lost leader stalled a partition
    assert refresh({"topic.metadata.refresh.interval.ms": "60000"}) == 60_000


def test_the_replayers_consumer_refreshes_partition_leaders_within_seconds_unless_kafka_client_says_otherwise():
    from gpcdc_toolkit.protocol import Topics
    from gpcdc_toolkit.replay._feed import consumer_config

    def refresh(client):
        return int(consumer_config({"bootstrap.servers": "b:9092", **client}, Topics("p"))
                   ["topic.metadata.refresh.interval.ms"])

    assert refresh({}) <= 10_000  # a partition left without a leader for a moment was not fetched for minutes
    assert refresh({"topic.metadata.refresh.interval.ms": "60000"}) == 60_000


def test_dsn_replaces_the_default_sandbox():
    config = load_config({"source.dsn": "host=db port=5432"}, environ={})
    assert config.source.dsn == "host=db port=5432" and config.source.sandbox is None


def test_dsn_and_sandbox_together_are_refused():
    with pytest.raises(ConfigError, match="both a DSN .* and a sandbox .*set only one"):
        load_config({"source.dsn": "host=db"}, environ={"GPCDC_SOURCE_SANDBOX": "mine"})


def test_missing_cluster_error_lists_every_place_looked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config({}, environ={"GPCDC_TARGET_SANDBOX": ""})
    message = str(caught.value)
    assert "no target cluster" in message
    assert "gpcdc.toml (absent)" in message and "environment" in message and "flags" in message
    assert "--target-dsn" in message


def test_unknown_setting_in_file_names_the_known_ones(tmp_path):
    path = write(tmp_path, '[source]\ndns = "typo"\n')
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) source.dns.*known settings are"):
        load_config({}, config_file=path, environ={})


def test_invalid_toml_names_the_file(tmp_path):
    path = write(tmp_path, "[source\n")
    with pytest.raises(ConfigError, match=f"config file {path} is not valid TOML"):
        load_config({}, config_file=path, environ={})


@pytest.mark.parametrize("content", [b"\xff\xfework_dir = 'x'\n", "work_dir = 'caf\u00e9'\n".encode("latin-1")])
def test_a_file_that_is_not_utf8_names_the_file(tmp_path, content):
    path = tmp_path / "gpcdc.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"config file {path} is not UTF-8 text \\(byte [0-9]+\\): save it as UTF-8"):
        load_config({}, config_file=path, environ={})


def test_config_file_from_environment(tmp_path):
    path = write(tmp_path, 'work_dir = "/srv/cdc"\n')
    config = load_config({}, environ={"GPCDC_CONFIG": str(path)})
    assert config.work_dir == Path("/srv/cdc")


def test_bad_topic_prefix():
    with pytest.raises(ConfigError, match="not a valid topic prefix"):
        load_config({"kafka.topic_prefix": "a b"}, environ={})


# Settings are declared once; what follows checks what is derived from the declaration.

def test_every_setting_has_a_file_key_an_environment_name_and_a_flag():
    for name, spec in SETTINGS.items():
        assert spec.env_var == "GPCDC_" + name.replace(".", "_").upper()
        assert spec.flag == "--" + name.replace(".", "-").replace("_", "-")
        assert spec.help
    assert {"capture.heartbeat_interval", "replay.batch_transactions", "replay.initial_load"} <= set(SETTINGS)


def test_typed_values_from_file_environment_and_flags(tmp_path):
    path = write(tmp_path, '[replay]\nbatch_transactions = 7\ninitial_load = false\n[capture]\nheartbeat_interval = 0.5\n')
    config = load_config({"capture.max_buffered": "10"}, config_file=path,
                         environ={"GPCDC_REPLAY_LEGACY_PER_SEGMENT": "yes", "GPCDC_CAPTURE_DISPATCHER": "key"})
    assert config.replay.batch_transactions == 7 and config.replay.initial_load is False
    assert config.replay.legacy_per_segment is True
    assert config.capture == CaptureSettings(dispatcher="key", heartbeat_interval=0.5, max_buffered=10)


@pytest.mark.parametrize("name, raw, where, message", [
    ("replay.batch_transactions", "many", "env", "is not an integer"),
    ("replay.batch_transactions", 1.5, "file", "is not an integer"),
    ("replay.batch_transactions", "0", "flag", "is below the minimum 1"),
    ("replay.initial_load", "perhaps", "env", "is not a boolean"),
    ("capture.heartbeat_interval", "fast", "flag", "is not a number"),
    ("capture.dispatcher", "round-robin", "file", "is not one of segment, key"),
    ("spark.master", 3.0, "file", "must be a string"),
    ("capture.heartbeat_interval", "nan", "env", "is not a finite number"),
    ("capture.max_backoff", "inf", "flag", "is not a finite number"),
    ("capture.metrics_port", "65000", "env", "is not a port in 1..64511 (or 0: off)"),
    ("replay.metrics_port", 70000, "file", "is not a port in 1..65535 (or 0: off)"),
    ("report.keep_runs", "-1", "flag", "is below the minimum 0"),
    ("validate.lock_timeout", "1e300", "flag", "is above PostgreSQL's longest lock_timeout, 2147483.647 s"),
    ("validate.lock_timeout", 2147484, "file", "is above PostgreSQL's longest lock_timeout"),
])
def test_a_bad_value_names_the_setting_the_value_and_where_it_came_from(tmp_path, name, raw, where, message):
    spec = SETTINGS[name]
    flags, environ, path = {}, {}, None
    if where == "flag":
        flags, origin = {name: raw}, f"flag {spec.flag}"
    elif where == "env":
        environ, origin = {spec.env_var: raw}, f"environment {spec.env_var}"
    else:
        section, key = name.split(".")
        value = f'"{raw}"' if isinstance(raw, str) else raw
        path, origin = write(tmp_path, f"[{section}]\n{key} = {value}\n"), "file"
    with pytest.raises(ConfigError) as caught:
        load_config(flags, config_file=path, environ=environ)
    assert str(caught.value).startswith(f"{name} = {raw!r} ({origin}) {message}")


def test_with_settings_checks_as_flags_do():
    config = load_config({}, environ={})
    changed = config.with_settings({"capture.heartbeat_interval": 0.3, "replay.batch_transactions": "9"})
    assert changed.capture.heartbeat_interval == 0.3 and changed.replay.batch_transactions == 9
    assert changed.origins["replay.batch_transactions"] == "code" and config.replay.batch_transactions == 500
    with pytest.raises(ConfigError, match="unknown setting"):
        config.with_settings({"capture.heartbeat": 1})
    with pytest.raises(ConfigError, match="is below the minimum"):
        config.with_settings({"replay.batch_rows": 0})


def _value_for(spec):
    if spec.type is bool:
        return st.booleans()
    if spec.name.endswith(".metrics_port"):
        return st.just(0) | st.integers(min_value=1, max_value=64511)  # 0: off; else a port with room above it
    if spec.type is int:
        return st.integers(min_value=int(spec.minimum or 0), max_value=10**9)
    if spec.type is float:
        return st.floats(min_value=spec.minimum or 0, max_value=1e6, allow_nan=False)
    if spec.choices:
        return st.sampled_from(spec.choices)
    if spec.name == "kafka.topic_prefix":
        return st.text(alphabet="abcXYZ09._-", min_size=1, max_size=20)
    if spec.name in ("source.dsn", "target.dsn"):
        return st.none()  # a DSN excludes the sandbox; covered by the tests above
    # Values a shell or a parser could mangle: quotes, spaces, '=' and leading dashes.
    return st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)


@settings(max_examples=50, deadline=None)
@given(st.fixed_dictionaries({name: _value_for(spec) for name, spec in SETTINGS.items()}))
def test_a_child_process_resolves_the_same_configuration_from_the_environment_it_is_given(values):
    config = load_config(values, environ={})
    again = load_config({}, environ=config_environment(config))
    assert again == dataclasses.replace(config, origins=again.origins)


def test_a_dsn_given_in_code_replaces_the_sandbox_and_children_read_the_same_file(tmp_path):
    path = write(tmp_path, '[kafka.client]\n"security.protocol" = "SSL"\n')
    config = load_config({}, config_file=path, environ={}).with_settings({"source.dsn": "host=db"})
    assert config.source.dsn == "host=db" and config.source.sandbox is None
    environment = config_environment(config)
    assert environment["GPCDC_CONFIG"] == str(path.absolute()) and "GPCDC_SOURCE_SANDBOX" not in environment
    assert load_config({}, environ=environment).kafka.client == {"security.protocol": "SSL"}
    with pytest.raises(ConfigError, match="both a DSN and a sandbox"):
        config.with_settings({"target.dsn": "host=x", "target.sandbox": "y"})


def test_a_commands_settings_are_accepted_after_its_name_without_undoing_those_before_it():
    args = build_parser().parse_args(["--replay-batch-transactions", "3", "--capture-max-buffered", "5",
                                      "replay", "--no-replay-initial-load"])
    flags = {k.split(":", 1)[1]: v for k, v in vars(args).items() if k.startswith("setting:")}
    config = load_config(flags, environ={})
    assert config.replay.batch_transactions == 3 and config.replay.initial_load is False
    assert config.capture.max_buffered == 5
    with pytest.raises(SystemExit):  # capture settings belong to capture commands
        build_parser().parse_args(["replay", "--capture-max-buffered", "5"])


def test_a_capture_workers_command_line_holds_no_setting_and_no_password(tmp_path):
    config = load_config({"work_dir": str(tmp_path), "source.dsn": "host=db user=u password=s3cret-Pw"}, environ={})
    group = CaptureGroup(config)
    argv = group.worker_argv(0)
    assert argv[-4:] == ["capture", "run", "--node", "0"] and not any("s3cret" in a for a in argv)
    assert config_environment(config)["GPCDC_SOURCE_DSN"] == "host=db user=u password=s3cret-Pw"
