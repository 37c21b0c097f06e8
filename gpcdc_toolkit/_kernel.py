"""An IPython extension that ``gpcdc run`` loads into the kernels it starts.

When the kernel ends, its objects are frozen rather than collected one by one: that
last collection walks every object still alive, about 1 s once Spark's, pandas' and
great-expectations' modules are loaded, and every run waits for it. Exit handlers
still run, last registered first: the notebook's own and its libraries' (registered
as its cells run), then the freeze, then IPython's (the namespace cleared, the history
closed) and ipykernel's, registered as the kernel started. What the notebook leaves in
reference cycles is then not finalized at exit, as Python does not promise it either.
"""

from __future__ import annotations

import atexit
import gc
from typing import Any


def load_ipython_extension(ipython: Any) -> None:  # noqa: ARG001 (the shell is not needed)
    atexit.register(gc.freeze)
