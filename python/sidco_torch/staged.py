"""An exchange whose rounds are posted a phase at a time, at the step's hook calls.

The reduce exchange takes several rounds per bucket (the blocks to their owners, then the
owners' selections to every rank), and each round needs what the one before brought. Waiting
for them in the hook body holds up the backward pass bucket after bucket, behind every rank
and behind the earlier buckets' collectives on the same process group. Instead a bucket's
rounds run as a generator that posts one phase's collectives and yields their work; every
later hook call of the step waits for each staged bucket's phase in flight and posts its
next (State._advance_exchanges), so the phases travel while autograd computes the next
buckets. Every rank posts the same collectives in the same order: DDP calls the hook for the
same buckets in the same order on every rank, and each call advances every staged bucket by
one phase, in the order they were staged; the step's last call drains them.
"""
import torch


class _Staged:
    """One bucket's exchange in phases. stages: a generator that posts a phase and yields the
    work to wait for before its next one, and returns the future of its last collective or
    None (done once the last phase's work is waited for). Its first phase is posted here.
    future: done once every phase's messages are in (the decode's then() hangs on it)."""

    def __init__(self, state, stages):
        self.state = state
        self.future = torch.futures.Future()
        self._stages = stages
        self._work = self._next(drain=False)

    def advance(self, drain):
        """Waits for the phase in flight and posts the next; True once no phase is left to post.
        drain: the last collective is waited for here too (the step ends or was cut short), so
        that the decode has run when this returns, unless the step's end runs it (finish())."""
        try:
            for w in self._work:
                w.wait()
        except BaseException as e:
            self.future.set_exception(e)
            raise
        self._work = self._next(drain)
        return self._work is None

    def abandon(self, error):
        """Gives up the phases left (an earlier bucket's collective failed: the process group
        cannot be trusted), so that nothing waits for this exchange's future."""
        if not self.future.done():
            self.future.set_exception(error)

    def _next(self, drain):
        """The next phase posted: its work, or None once the generator returned."""
        try:
            return next(self._stages)
        except StopIteration as finished:
            last = finished.value
            if last is None:
                self.future.set_result(None)
            elif drain or self.state._callbacks.at_step_end:
                # Not through then(): at the step's end finish() runs the callbacks in order,
                # the decode's before a relay it would wait for.
                try:
                    last.wait()
                except RuntimeError:
                    pass  # _relay reads the error from last.value()
                self._relay(last)
            else:
                self.state._callbacks.then(last, self._relay)
            return None
        except BaseException as e:
            self.future.set_exception(e)
            raise

    def _relay(self, last):
        try:
            last.value()  # a failed collective raises here
        except BaseException as e:
            self.future.set_exception(e)
            return
        self.future.set_result(None)
