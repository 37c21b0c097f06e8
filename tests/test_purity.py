"""The pure core imports no I/O library: it runs, and is tested, without servers."""

import subprocess
import sys

PURE = ["gpcdc_toolkit.protocol", "gpcdc_toolkit.citus", "gpcdc_toolkit.replay._order", "gpcdc_toolkit.replay._compact",
        "gpcdc_toolkit.replay._source", "gpcdc_toolkit.replay._legacy", "gpcdc_toolkit.replay._ddl_policy",
        "gpcdc_toolkit.validate._diff", "gpcdc_toolkit.validate._stores", "gpcdc_toolkit.config", "gpcdc_toolkit.audit._findings",
        "gpcdc_toolkit.audit._faults", "gpcdc_toolkit.validate._chunks", "gpcdc_toolkit.report"]
IO = ["psycopg", "psycopg2", "confluent_kafka", "pyspark", "sqlite3"]


def test_the_pure_core_imports_no_io_library():
    probe = (f"import sys\nfor m in {PURE!r}: __import__(m)\n"
             f"print(','.join(m for m in {IO!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"the pure core imported {done.stdout.strip()}"


def test_a_capture_host_needs_neither_spark_nor_the_notebook_stack():
    # Each of these made unimportable: the command line, bootstrap, capture and replay load all the same.
    probe = ("import sys\n"
             "for m in ('pyspark', 'pyarrow', 'pandas', 'plotly', 'papermill', 'great_expectations', 'ipywidgets'):\n"
             "    sys.modules[m] = None\n"
             "import gpcdc_toolkit.bootstrap, gpcdc_toolkit.capture, gpcdc_toolkit.replay, gpcdc_toolkit.demo\n"
             "from gpcdc_toolkit.replay import Replayer\n"
             "from gpcdc_toolkit.cli import build_parser\n"
             "build_parser().parse_args(['capture', 'run', '--node', '0'])\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
