"""The step's then() callbacks, run so that no gloo worker needs the GIL once the step ends.

torch 1.13 frees a then() callback on the thread that ran it and takes the GIL to do so
(PythonFunctionGuard), after the future DDP waits for is already complete; a future whose
value is a Python object takes it too when a worker drops its last reference (collect_all's
bookkeeping does, after its future completes). A process group destroyed in that window (a
DDP model dropped right after its step, as a test or a short script does) joins that worker
holding the GIL, and the two wait for each other forever (seen: 3 of 3 runs of 40 rounds
hung). So the step's last hook call runs the last bucket's callbacks on its own thread and
returns only once every callback a worker ran is freed (DDP waits for all of them right
after that call anyway), and the step's futures are kept until the next step begins."""
import functools
import threading
import warnings
import weakref

import torch


class _StepCallbacks:
    """then() for the hook's futures, and the step's end (finish)."""

    # How long finish waits for the workers' callbacks before it warns (it keeps waiting: a
    # collective in flight ends by itself or by its process group's timeout).
    WARN_AFTER_SECONDS = 60.0
    # A step that raises waits at most this long for them, then raises its error anyway.
    FAILED_WAIT_SECONDS = 30.0

    def __init__(self, keep):
        self._keep = keep    # keep(*futures): held until the next step begins (State._in_flight)
        self._freed = threading.Condition()
        self._alive = set()  # weak references to the callbacks handed to a future, not yet freed
        self._gates = []     # (gate, future): the callbacks finish runs on this thread
        self.at_step_end = False  # set for the step's last hook call

    def then(self, future, fn):
        """future.then(fn); at the step's last hook call, fn runs in finish() instead, on the
        hook's thread, once future is done."""
        if self.at_step_end:
            gate = torch.futures.Future()
            self._gates.append((gate, future))
            child = gate.then(lambda _: fn(future))
        else:
            # What the worker frees is counted, not fn: a traceback that an error keeps (State's
            # error) holds fn's frame and so fn; no frame holds the partial that calls it.
            call = functools.partial(fn)
            ref = weakref.ref(call, self._release)
            with self._freed:
                self._alive.add(ref)
            child = future.then(call)
        self._keep(future, child)  # no worker drops the last reference to one
        return child

    def _release(self, ref):
        with self._freed:
            self._alive.discard(ref)
            self._freed.notify_all()

    def finish(self, failed=False):
        """The step's end: the gated callbacks run here (failed: only those whose future is
        done; the others go with their gate), then waits until every callback handed to a
        worker is freed."""
        gates, self._gates = self._gates, []
        self.at_step_end = False
        for gate, future in gates:
            if failed and not future.done():
                continue
            try:
                future.wait()  # without the GIL: the workers' callbacks run meanwhile
            except RuntimeError:
                pass  # fn reads the error from future.value(): its future carries it
            gate.set_result(None)
        limit = self.FAILED_WAIT_SECONDS if failed else self.WARN_AFTER_SECONDS
        with self._freed:
            if self._freed.wait_for(lambda: not self._alive, timeout=limit) or failed:
                return
            warnings.warn(f"sidco_torch: the step's end has waited {limit:.0f} s for {len(self._alive)} "
                          "exchange callbacks (their collectives are still in flight); still waiting",
                          RuntimeWarning, stacklevel=3)
            self._freed.wait_for(lambda: not self._alive)
