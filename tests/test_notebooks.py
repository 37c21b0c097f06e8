"""The notebooks, executed by papermill with parameters, against real servers."""

import json
import uuid
from pathlib import Path

import papermill

from gpcdc_toolkit.bootstrap import Pipeline, drop_slots
from gpcdc_toolkit.protocol import StartPoint

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def cell_errors(notebook: Path) -> list[str]:
    data = json.loads(notebook.read_text())
    return [o["ename"] for c in data["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])
            if o.get("output_type") == "error"]


def test_bootstrap_notebook(work_dir, broker, source_sandbox, source, tmp_path):
    prefix = f"nb{uuid.uuid4().hex[:6]}"
    out = tmp_path / "bootstrap.ipynb"
    try:
        papermill.execute_notebook(
            str(NOTEBOOKS / "bootstrap.ipynb"), str(out), kernel_name="python3", progress_bar=False,
            parameters={"work_dir": str(work_dir), "source_sandbox": "source", "topic_prefix": prefix,
                        "kafka_bootstrap_servers": broker.bootstrap_servers, "method": "peaceful"},
        )
        assert cell_errors(out) == []
        start = Pipeline(work_dir, prefix).start_point()
        assert isinstance(start, StartPoint) and start.method == "peaceful" and len(start.nodes) == 4
        text = out.read_text()
        assert "created slots with the peaceful method" in text and "Initial snapshot rows per segment" in text
    finally:
        pipeline = Pipeline(work_dir, prefix)
        drop_slots(source, pipeline.slot, publication=pipeline.publication)


def test_replay_notebook(work_dir, source, replay_target, tmp_path):
    from gpcdc_toolkit.bootstrap import bootstrap
    from gpcdc_toolkit.capture import wait_until_acknowledged
    from gpcdc_toolkit.validate import table_rows
    from gpcdc_toolkit.workload import ACCOUNTS, EVENTS, WorkloadSpec, reset_tables, run_workload

    target, config, pipeline, group = replay_target
    reset_tables(source)
    run_workload(source, WorkloadSpec(threads=1, transactions=30, hot_keys=2, seed=4))
    bootstrap(source, pipeline, "snapshot")
    group.start()
    run_workload(source, WorkloadSpec(threads=2, transactions=100, hot_keys=2, seed=5))
    wait_until_acknowledged(source, pipeline.slot)
    out = tmp_path / "replay.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOKS / "replay.ipynb"), str(out), kernel_name="python3", progress_bar=False,
        parameters={"work_dir": str(work_dir), "source_sandbox": "source", "target_sandbox": target.name,
                    "topic_prefix": config.kafka.topic_prefix, "kafka_bootstrap_servers": config.kafka.bootstrap_servers},
    )
    assert cell_errors(out) == []
    text = out.read_text()
    assert "Transactions applied and pending" in text and "Rows per table, target and source" in text
    target_cluster = target.cluster()
    for table in (ACCOUNTS, EVENTS):
        assert table_rows(target_cluster, table) == table_rows(source, table)
