"""Thin Python names over the custom ops (torch.ops.sidco.*)."""
import torch


class Compressor:
    """One tensor's compressor (its adaptive state and per-layer layout persist across
    calls). method: sidco-e, sidco-gp, sidco-gamma-gp, sidco-e-single, sidco-e-exact, top-k,
    random-k, dgc, gaussian-k, redsync. options: seed (random-k)."""

    def __init__(self, method="sidco-e", **options):
        self._impl = torch.classes.sidco.Compressor(method, {k: float(v) for k, v in options.items()})
        self.method = method

    def compress(self, gradient, density, layer_sizes=None, residual=None):
        """(indices int64, values) of gradient (+ residual, which keeps what is not sent) at
        density; estimated per layer when layer_sizes is given."""
        return self._impl.compress(gradient, float(density), list(layer_sizes or []), residual)

    def report(self):
        """What the last compress did: threshold, selected, density, stages, ..."""
        return dict(self._impl.report())


def compress(gradient, density, method="sidco-e", layer_sizes=None, residual=None, **options):
    """One-shot compress with a fresh compressor (no adaptive state kept)."""
    return Compressor(method, **options).compress(gradient, density, layer_sizes, residual)


def decompress(indices, values, size):
    return torch.ops.sidco.decompress(indices, values, int(size))


def scatter_add_(dense, indices, values, scale=1.0):
    return torch.ops.sidco.scatter_add_(dense, indices, values, float(scale))
