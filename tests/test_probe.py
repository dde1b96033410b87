"""memzoo.core.probe: a plugin's probes reach a listener with the tensors docs/plugins.md names, a
listener leaves the outputs bit-identical, and listening stops when `recording` leaves."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model
from memzoo.core.probe import probe, recording

B, S, N = 2, 3, 8
# method -> {probe it shows: the values each call carries}
DELTA = {"gated-deltanet.recurrence": {"layer", "q", "k", "v", "g", "beta", "s0", "reset", "state", "chunk_size"}}
INFINI = {"infini.memory": {"layer", "sq", "sk", "v", "read"}}
TITANS = {"titans.scan": {"keys", "values", "queries", "log_keep", "log_eta", "lr", "grad_clip", "states_before", "reads",
                          "weights", "momentum"},
          "titans.inner_grad": {"deltas", "acts"}, "titans.l2n": {"x"}}
PROBED = {
    "armt": {"armt.read": {"layer", "phi", "A", "z", "eps", "floor", "read"},
             "armt.write": {"layer", "A", "z", "k", "v", "beta", "empty", "eps", "floor", "cos_floor"}},
    "deltanet": DELTA, "gated-deltanet": DELTA, "infini-linear": INFINI, "infini-delta": INFINI,
    "memorizing": {"memorizing.read": {"layer", "q_hat", "keys"}},
    "titans-mac": TITANS, "titans-mag": TITANS,
}
LOOP = {"gated-deltanet": {"chunkwise": False}, "infini-linear": {"vectorized": False}}  # the other code path


def logits(model: torch.nn.Module) -> torch.Tensor:
    tokens = torch.randint(0, 256, (B, S, N), generator=torch.Generator().manual_seed(7))
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[1, 2] = True
    with torch.no_grad():
        return model(tokens, reset=reset).logits  # [B, S, N, V]


@pytest.mark.parametrize("method, options", [(m, None) for m in PROBED] + [(m, o) for m, o in LOOP.items()])
def test_a_listener_sees_the_named_values_and_the_outputs_stay_bit_identical(method: str, options) -> None:
    model = tiny_model(method, options=options).double()
    plain = logits(model)
    with recording() as seen:
        heard = logits(model)
    assert torch.equal(plain, heard)
    assert seen and {n for n, _ in seen} == set(PROBED[method])
    assert all(set(values) == PROBED[method][name] for name, values in seen)
    layers = {values["layer"] for _, values in seen if "layer" in values}
    assert layers == set(range(model.cfg.n_layers)) or method == "memorizing" or method.startswith("titans")  # kNN: one layer


def test_the_bit_identity_check_sees_a_listener_that_writes() -> None:
    """Control: a listener that scales ARMT's v in place before the write moves the logits of the
    later segments (the test above is not vacuous)."""
    model = tiny_model("armt", options={"w_v_init_std": 0.3}).double()
    plain = logits(model)
    with recording(lambda name, values: values["v"].mul_(2.0), names={"armt.write"}):
        moved = logits(model)
    assert torch.equal(plain[:, 0], moved[:, 0]) and not torch.equal(plain[:, 1:], moved[:, 1:])


def test_the_deltanet_probe_carries_the_state_it_leaves() -> None:
    """The recorded `state` of the last call is the state the model carries on; `s0` of the first is zero."""
    model = tiny_model("deltanet").double()
    tokens = torch.randint(0, 256, (B, S, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), recording() as seen:
        out = model(tokens)
    last = {values["layer"]: values["state"] for _, values in seen}
    assert all(float(values["s0"].abs().max()) == 0.0 for _, values in seen)  # one call a layer, from empty
    for i, layer_state in enumerate(out.state.layers):
        assert torch.equal(layer_state["S"], last[i])


def test_recording_keeps_the_names_asked_for_and_stops_when_it_leaves() -> None:
    heard: list[tuple[str, dict]] = []
    with recording(lambda name, values: heard.append((name, values))), recording(names={"a"}) as only_a:
        probe("a", x=1)
        probe("b", y=2)
    probe("a", x=3)  # nobody listens any more
    assert only_a == [("a", {"x": 1})]
    assert heard == [("a", {"x": 1}), ("b", {"y": 2})]
