"""An IPython extension that ``gpcdc run`` loads into the kernels it starts.

When the kernel ends, its objects are frozen rather than collected one by one: that
last collection walks every object still alive, about 1 s once Spark's, pandas' and
great-expectations' modules are loaded, and every run waits for it. Exit handlers
still run, last registered first: the notebook's own and its libraries' (registered
as its cells run), then the freeze, then IPython's (the namespace cleared, the history
closed) and ipykernel's, registered as the kernel started. What the notebook leaves in
reference cycles is then not finalized at exit, as Python does not promise it either.

Before the freeze, a kernel ending on a shutdown request waits for the thread that
handles it to finish. ipykernel (7.4) stops the main thread's loop while that thread
still has output to flush and a last status to publish; the main thread's exit then
stops the output thread under it, and the flush waits 10 s on an output thread that
no longer runs its loop, until the kernel is terminated (about 1 shutdown in 5).
"""

from __future__ import annotations

import atexit
import gc
import threading
from typing import Any

#: The longest wait for the thread handling the shutdown request: as long as ipykernel's
#: own wait for a flush, after which that thread goes on by itself.
CONTROL_THREAD_WAIT_S = 10.0


def load_ipython_extension(ipython: Any) -> None:
    atexit.register(gc.freeze)
    if (kernel := getattr(ipython, "kernel", None)) is not None:
        atexit.register(_shutdown_request_finished, kernel)


def _shutdown_request_finished(kernel: Any) -> None:
    """Wait for the control thread to finish a shutdown request it is handling (its loop
    stops at the end of it), so that it flushes while the output thread still runs.
    A kernel ending otherwise (no shutdown request handled) does not wait."""
    thread = getattr(kernel, "control_thread", None)
    if (getattr(kernel, "_shutdown_message", None) is not None and isinstance(thread, threading.Thread)
            and thread is not threading.current_thread()):
        thread.join(CONTROL_THREAD_WAIT_S)
