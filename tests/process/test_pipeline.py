"""Pipelined stages (``paramserver.integrations.pipeline``, issue 16): 1F1B over 2 and 3 stage
processes gives the gradients of one process on the whole mini-batch (within 1e-5),
for any number of micro-batches; an SGD step moves every stage's parameters as one
process would; a stage process that dies is named, not waited on; bad batches are
refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the torch extra: CI installs it

from torch import nn  # noqa: E402

from paramserver.integrations.pipeline import PipelineError, pipeline  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def _model(seed=0, hidden=32, depth=6):
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) for _ in range(depth)]


def _one_process(blocks, x, y):
    model = nn.Sequential(*copy.deepcopy(blocks))
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return float(loss.detach()), [p.grad.numpy().copy() for p in model.parameters()], model


@pytest.mark.parametrize("cuts,microbatches", [([3], 1), ([3], 4), ([2, 4], 3), ([2, 4], 8), ([1, 5], 6)])
def test_gradients_equal_one_process(cuts, microbatches):
    blocks = _model()
    x, y = torch.randn(48, 32), torch.randn(48, 32)
    loss, want, _ = _one_process(blocks, x, y)
    bounds = [0, *cuts, len(blocks)]
    stages = [nn.Sequential(*copy.deepcopy(blocks[a:b])) for a, b in zip(bounds, bounds[1:])]
    with pipeline(stages, nn.functional.mse_loss, microbatches) as pipe:
        got_loss = pipe.step(x, y)
        got = [g for stage in pipe.gradients() for g in stage]
        assert all(r > 0 for r in pipe.peak_rss_mb())
    assert abs(got_loss - loss) < 1e-5
    assert len(got) == len(want)
    assert max(float(np.abs(a - b).max()) for a, b in zip(got, want)) < 1e-5


def _sgd_one_process(blocks, data, lr=0.1):
    """Losses of SGD steps on ``data`` by one process, and the model after them."""
    model = nn.Sequential(*copy.deepcopy(blocks))
    losses = []
    for x, y in data:
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        losses.append(float(loss.detach()))
    return losses, model


def test_sgd_steps_match_one_process():
    blocks = _model(seed=1)
    data = [(torch.randn(16, 32), torch.randn(16, 32)) for _ in range(4)]
    want, _ = _sgd_one_process(blocks, data)
    stages = [nn.Sequential(*copy.deepcopy(blocks[:3])), nn.Sequential(*copy.deepcopy(blocks[3:]))]
    with pipeline(stages, nn.functional.mse_loss, 4, lr=0.1) as pipe:
        got = [pipe.step(x, y) for x, y in data]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_a_dead_stage_is_named_and_bad_batches_are_refused():
    blocks = _model()
    stages = [nn.Sequential(*copy.deepcopy(blocks[:3])), nn.Sequential(*copy.deepcopy(blocks[3:]))]
    with pipeline(stages, nn.functional.mse_loss, 4, timeout_s=60) as pipe:
        with pytest.raises(Exception, match="cannot be cut into 4 equal micro-batches"):
            pipe.step(torch.randn(10, 32), torch.randn(10, 32))
        pipe.procs[1].kill()
        pipe.procs[1].join(timeout=30)
        with pytest.raises(PipelineError, match="stage 1's process died"):
            pipe.step(torch.randn(8, 32), torch.randn(8, 32))


class DieOnce(nn.Module):
    """Passes its input through; its process exits at its ``at``-th forward, once (a marker
    file says it did, so that the stage started again lives)."""

    def __init__(self, marker, at):
        super().__init__()
        self.marker, self.at, self.calls = str(marker), at, 0

    def forward(self, x):
        import os

        self.calls += 1
        if self.calls == self.at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return x


def test_a_dead_stage_restarts_from_its_namespace_and_the_batch_in_flight_counts_once(tmp_path):
    from paramserver import LocalCluster

    blocks = _model(seed=3)
    data = [(torch.randn(16, 32), torch.randn(16, 32)) for _ in range(4)]
    want, model = _sgd_one_process(blocks, data)
    # stage 1 dies in its 6th forward: the 2nd micro-batch of the 2nd mini-batch, with stage 0 mid-schedule
    stages = [nn.Sequential(*copy.deepcopy(blocks[:3])),
              nn.Sequential(DieOnce(tmp_path / "died", at=6), *copy.deepcopy(blocks[3:]))]
    with LocalCluster(servers=2, log_level="WARNING") as cluster:
        with pipeline(stages, nn.functional.mse_loss, 4, lr=0.1, ps=cluster, namespace="pipe", timeout_s=60) as pipe:
            got = [pipe.step(x, y) for x, y in data]
            params = [p for stage in pipe.parameters() for p in stage]
            assert pipe.restarts == [1] and pipe.committed == 4
        tables = cluster.client.admin.namespaces()["pipe"]["tables"]
    assert (tmp_path / "died").exists()  # it did die
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)  # one loss a mini-batch: the replay counted once
    want_params = [p.detach().numpy() for p in model.parameters()]
    assert max(float(np.abs(a - b).max()) for a, b in zip(params, want_params)) < 1e-5
    assert sorted(tables) == ["pipe/stage0", "pipe/stage1"]
