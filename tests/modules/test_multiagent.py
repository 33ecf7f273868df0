"""``MultiAgentMLP``: shapes, sharing, centralization, independence of per-agent weights."""

from __future__ import annotations

import pytest
import torch

from recurrl.modules import MultiAgentMLP

N, F, OUT = 3, 4, 2


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("centralized", [True, False])
@pytest.mark.parametrize("batch", [(), (5,), (2, 4)])
def test_shapes(share, centralized, batch):
    torch.manual_seed(0)
    m = MultiAgentMLP(F, OUT, N, centralized=centralized, share_params=share, num_cells=[8, 8])
    assert m(torch.randn(*batch, N, F)).shape == (*batch, N, OUT)


def test_shared_local_is_one_mlp_per_agent():
    torch.manual_seed(0)
    m = MultiAgentMLP(F, OUT, N, share_params=True)
    x = torch.randn(6, N, F)
    torch.testing.assert_close(m(x), torch.stack([m.net(x[:, i]) for i in range(N)], 1))
    perm = [2, 0, 1]
    torch.testing.assert_close(m(x[:, perm]), m(x)[:, perm])


def test_per_agent_outputs_depend_only_on_own_weights_and_input():
    torch.manual_seed(0)
    m = MultiAgentMLP(F, OUT, N, share_params=False, depth=2, num_cells=8)
    x = torch.randn(6, N, F)
    y = m(x)
    # agent i's output is its own MLP on its own input
    for i in range(N):
        h = x[:, i]
        for layer in m.net:
            h = h @ layer.weight[i].T + layer.bias[i] if hasattr(layer, "weight") else layer(h)
        torch.testing.assert_close(y[:, i], h)
    x2 = x.clone()
    x2[:, 1] += 1.0
    y2 = m(x2)
    torch.testing.assert_close(y2[:, [0, 2]], y[:, [0, 2]])
    assert not torch.allclose(y2[:, 1], y[:, 1])
    with torch.no_grad():
        m.net[0].weight[2] += 0.5
    y3 = m(x)
    torch.testing.assert_close(y3[:, :2], y[:, :2])
    assert not torch.allclose(y3[:, 2], y[:, 2])
    # the weights differ per agent: the same input gives different outputs
    same = m(x[:, :1].expand(-1, N, -1))
    assert not torch.allclose(same[:, 0], same[:, 1])


def test_centralized_reads_every_agent():
    torch.manual_seed(0)
    for share in (True, False):
        m = MultiAgentMLP(F, 1, N, centralized=True, share_params=share)
        x = torch.randn(4, N, F)
        x2 = x.clone()
        x2[:, 2] += 1.0
        assert not torch.allclose(m(x)[:, 0], m(x2)[:, 0])  # agent 0 sees agent 2's input
    shared = MultiAgentMLP(F, 1, N, centralized=True)
    v = shared(x)
    torch.testing.assert_close(v, v[:, :1].expand_as(v))


def test_reference_spelling_and_errors():
    m = MultiAgentMLP(F, OUT, N, centralised=True)
    assert m.centralized
    with pytest.raises(ValueError, match="two spellings"):
        MultiAgentMLP(F, OUT, N, centralized=False, centralised=True)
    with pytest.raises(ValueError, match="needs n_agent_inputs"):
        MultiAgentMLP(None, OUT, N, share_params=False)
    with pytest.raises(ValueError, match="n_agents must be an int"):
        MultiAgentMLP(F, OUT, 0)
    with pytest.raises(ValueError, match=r"expected an input \[\*B, n_agents=3"):
        MultiAgentMLP(F, OUT, N)(torch.randn(2, N + 1, F))
    lazy = MultiAgentMLP(None, OUT, N)
    assert lazy(torch.randn(2, N, 7)).shape == (2, N, OUT)
