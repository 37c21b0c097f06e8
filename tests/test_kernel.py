"""The kernels ``gpcdc run`` starts end on a shutdown request by themselves (``_kernel.py``)."""

from __future__ import annotations

import os
import sys

from gpcdc_toolkit.report._runner import kernel_arguments

# ipykernel 7.4 leaves to chance whether the thread handling a shutdown request flushes
# its output before or while the main thread's exit stops the output thread. This
# extension holds that last flush until the main thread either joins the control thread
# (as the toolkit's extension makes it do first) or begins stopping the output thread
# (ipykernel's own exit handler, which joins the control thread only after that); the
# output thread, stopping, waits for the flush, which itself waits for the output thread
# (its timeout shortened from 10 s to 1 s so that a failure comes soon).
INTERLEAVING = '''
import sys, threading

def load_ipython_extension(ipython):
    kernel = ipython.kernel
    control, output = kernel.control_thread, kernel.iopub_thread
    go, flushed = threading.Event(), threading.Event()
    stream, close, join = sys.stdout, output.io_loop.close, control.join
    stream.flush_timeout = 1

    def close_after_the_flush(*args, **kwargs):
        go.set()
        flushed.wait(30)
        close(*args, **kwargs)

    def joined(*args, **kwargs):
        go.set()
        join(*args, **kwargs)

    def flush():
        last = threading.current_thread() is control and kernel._shutdown_message is not None
        if last:
            go.wait(60)
        type(stream).flush(stream)
        if last:
            flushed.set()

    output.io_loop.close = close_after_the_flush
    control.join = joined
    stream.flush = flush
'''


def test_a_kernel_asked_to_shut_down_flushes_its_output_before_it_stops_it(tmp_path):
    from jupyter_client.manager import KernelManager

    (tmp_path / "interleaving.py").write_text(INTERLEAVING)
    log = tmp_path / "kernel.log"
    manager = KernelManager(kernel_name="python3", shutdown_wait_time=120)  # never terminated here
    arguments = [*kernel_arguments(manager.kernel_spec.argv), "--IPKernelApp.extra_extensions=interleaving"]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    with log.open("wb") as output:
        manager.start_kernel(extra_arguments=arguments, env=environment, stdout=output, stderr=output)
    process = manager.provisioner.process
    client = manager.client()
    try:
        client.start_channels()
        client.wait_for_ready(timeout=120)
        printed: list[str] = []
        client.execute_interactive("import sys; print(sorted({'gpcdc_toolkit._kernel', 'interleaving'} & set(sys.modules)))",
                                   timeout=120, output_hook=lambda m: printed.append(m["content"].get("text", "")))
        assert "".join(printed).strip() == "['gpcdc_toolkit._kernel', 'interleaving']"
        manager.shutdown_kernel()  # asks, and waits for the kernel to end
    finally:
        client.stop_channels()
        if manager.has_kernel:
            manager.shutdown_kernel(now=True)
    text = log.read_text(errors="replace")
    assert "IOStream.flush timed out" not in text, text[-3000:]
    assert process.returncode == 0, text[-3000:]  # it ended by itself
