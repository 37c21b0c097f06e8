from pathlib import Path

import pytest

from gpcdc_toolkit import ConfigError, load_config


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
    assert config.spark_master == "local[1]"
    assert config.origins["kafka.topic_prefix"] == "flag --kafka-topic-prefix"
    assert config.origins["kafka.bootstrap_servers"] == "environment GPCDC_KAFKA_BOOTSTRAP_SERVERS"
    assert config.origins["spark.master"] == "file"


def test_client_settings_table_passes_through(tmp_path):
    path = write(tmp_path, '[kafka.client]\n"security.protocol" = "SASL_SSL"\n"linger.ms" = 5\n')
    config = load_config({}, config_file=path, environ={})
    assert config.kafka.client == {"security.protocol": "SASL_SSL", "linger.ms": "5"}


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


def test_config_file_from_environment(tmp_path):
    path = write(tmp_path, 'work_dir = "/srv/cdc"\n')
    config = load_config({}, environ={"GPCDC_CONFIG": str(path)})
    assert config.work_dir == Path("/srv/cdc")


def test_bad_topic_prefix():
    with pytest.raises(ConfigError, match="not a valid topic prefix"):
        load_config({"kafka.topic_prefix": "a b"}, environ={})
