"""One or more optimizers over disjoint parameter groups behind one step, zero_grad, state_dict
and load_state_dict (torchtitan's OptimizersContainer is the model): under optim=muon, Muon on
the hidden matrices and AdamW on the rest; under optim=adamw, AdamW alone.

A checkpoint holds {"optimizers": {part name: that optimizer's state_dict()}}. A checkpoint from
before the container holds one AdamW's state_dict() itself: it loads into a container whose only
part is that AdamW (the same groups in the same order, so a resume is bit-exact); into any other
it is refused in one line (CheckpointError).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch

from ablate.errors import CheckpointError

PARTS = "optimizers"  # the state dict's key: part name -> its state dict


def is_legacy(state: Mapping[str, Any]) -> bool:
    """A single torch optimizer's state dict (what checkpoints held before the container)."""
    return PARTS not in state and "param_groups" in state


class Optimizers:
    """The run's optimizers, by part name ("adamw", "muon"), each over its own parameters."""

    def __init__(self, parts: Mapping[str, torch.optim.Optimizer]):
        self.parts = dict(parts)
        seen: set[int] = set()
        for name, opt in self.parts.items():
            ids = {id(p) for g in opt.param_groups for p in g["params"]}
            if ids & seen:
                raise ValueError(f"optimizer part '{name}' shares parameters with another part")
            seen |= ids

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.parts.values())

    @property
    def param_groups(self) -> list[dict]:
        """Every part's groups, in part order (the schedule sets each group's LR)."""
        return [g for opt in self for g in opt.param_groups]

    @property
    def state(self) -> dict:
        """Every part's per-parameter state (parameters are disjoint)."""
        return {p: s for opt in self for p, s in opt.state.items()}

    def step(self) -> None:
        for opt in self:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {PARTS: {name: opt.state_dict() for name, opt in self.parts.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name, part in self.split(state).items():
            self.parts[name].load_state_dict(part)

    def split(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """A checkpoint's state dict by part, checked against this container's parts; a legacy
        one (a single AdamW's) is the "adamw" part's when that is the only part."""
        if is_legacy(state):
            if list(self.parts) != ["adamw"]:
                raise CheckpointError(f"the checkpoint holds one AdamW's state (written before optim=muon "
                                      f"existed); this run's optimizers are {' + '.join(self.parts)}: resume "
                                      "it with optim=adamw, or start over with train.resume=never")
            return {"adamw": state}
        saved = dict(state.get(PARTS) or {})
        if list(saved) != list(self.parts):
            raise CheckpointError(f"the checkpoint holds the optimizers {' + '.join(saved) or 'none'}, this "
                                  f"run has {' + '.join(self.parts)}: resume it with the optim it was "
                                  "written with, or start over with train.resume=never")
        return saved
