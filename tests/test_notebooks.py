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
