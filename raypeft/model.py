"""A frozen backbone plus a prompt method: the module a trial trains."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from raypeft.backbones import Backbone
from raypeft.methods import MethodConfig, PromptMethod, build_method

TRAINABLE_FILE = "trainable.safetensors"


class PromptedModel(nn.Module):
    """Runs ``method.prepare_inputs`` then the frozen backbone with its task head."""

    def __init__(self, backbone: Backbone, method_config: MethodConfig):
        super().__init__()
        self.backbone = backbone.model
        self.dims = backbone.dims
        self.method: PromptMethod = build_method(
            method_config.resolve(backbone.dims), backbone.dims, backbone.word_embeddings
        )
        self._head_names = {name for name, p in self.backbone.named_parameters() if p.requires_grad}

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        embed = self.backbone.get_input_embeddings()
        kwargs = self.method.prepare_inputs(input_ids, attention_mask, token_type_ids, embed)
        return self.backbone(**kwargs).logits

    def train(self, mode: bool = True) -> PromptedModel:
        # The backbone (task head included: a Linear layer, no dropout of its own) always runs
        # in eval mode: it is frozen, and its dropout would only add noise to the prompt's
        # gradients. Only the method's modules see training mode.
        super().train(mode)
        self.backbone.eval()
        return self

    def param_groups(self) -> dict[str, list[nn.Parameter]]:
        """The method's named groups plus ``head``."""
        groups = dict(self.method.param_groups())
        groups["head"] = [p for n, p in self.backbone.named_parameters() if n in self._head_names]
        return groups

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Only the tensors that train: ``method.*`` and ``head.*`` (backbone names)."""
        state = {f"method.{k}": v for k, v in self.method.state_dict().items()}
        for name, p in self.backbone.named_parameters():
            if name in self._head_names:
                state[f"head.{name}"] = p
        return {k: v.detach().cpu().contiguous() for k, v in state.items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        expected = {k: v.shape for k, v in self.trainable_state_dict().items()}
        if set(state) != set(expected):
            missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
            raise ValueError(
                f"trainable tensors do not match: missing {missing}, unexpected {extra}"
            )
        wrong = [
            f"{k} {tuple(v.shape)} != {tuple(expected[k])}"
            for k, v in state.items()
            if v.shape != expected[k]
        ]
        if wrong:  # copy_ would broadcast a 1-label head into a 2-label one silently
            raise ValueError(f"trainable tensor shapes do not match: {', '.join(wrong)}")
        method_state = {k[len("method.") :]: v for k, v in state.items() if k.startswith("method.")}
        self.method.load_state_dict(method_state)
        params = dict(self.backbone.named_parameters())
        with torch.no_grad():
            for key, value in state.items():
                if key.startswith("head."):
                    params[key[len("head.") :]].copy_(value)

    def save_trainable(self, folder: Path) -> Path:
        path = Path(folder) / TRAINABLE_FILE
        save_file(self.trainable_state_dict(), str(path))
        return path

    def load_trainable(self, folder: Path) -> None:
        self.load_trainable_state_dict(load_file(str(Path(folder) / TRAINABLE_FILE)))
