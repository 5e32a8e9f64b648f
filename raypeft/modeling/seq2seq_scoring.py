"""How a seq2seq model (T5) answers a classification task: it writes the answer, or each
class's text is scored and the likeliest one wins.

- ``generate`` (DePT's protocol): greedy decoding, the text mapped back to the class it names
  (:data:`raypeft.data.metrics.NO_CLASS` when it names none, counted wrong by every metric).
- ``rank`` (rank classification): the decoder scores every class's verbalizer given the input,
  teacher-forced exactly as training feeds the target, and the class with the highest
  log-likelihood is predicted, so every prediction is a class.

The score of a class is the **sum** of its target tokens' log-probabilities, end token
included: the log-probability that the model writes exactly that text and stops, the quantity
training maximises (its loss is the mean of the same terms per token), and what T0's
evaluation ranks by (bigscience-workshop/t-zero). A per-token average is another model of
the answer:
it forgives a long verbalizer its extra tokens (``not_entailment`` is several tokens against
``entailment``'s one or two) and no longer says which text greedy decoding would prefer. The
end token keeps a verbalizer that is a prefix of another (``not`` / ``not_entailment``) from
scoring as well as the longer one.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.modeling_outputs import BaseModelOutput

from raypeft.modeling.precision import autocast


def verbalizer_ids(tokenizer, verbalizers: list[str]) -> list[list[int]]:
    """Each class's target token ids, tokenised as training tokenises its targets
    (:func:`raypeft.data.tokenize.target_ids`, without the padding)."""
    return [list(tokenizer(text)["input_ids"]) for text in verbalizers]


@torch.no_grad()
def class_log_likelihoods(
    model: torch.nn.Module, inputs: dict, targets: list[list[int]], precision: str = "fp32"
) -> torch.Tensor:
    """``(batch, classes)`` float32: ``log p(target_c | input)`` of every class's token ids.

    ``model`` is the seq2seq backbone and ``inputs`` its keyword inputs (the method's prompted
    ``inputs_embeds`` and attention mask). The encoder runs once; the decoder once per class,
    over that class's tokens only (no padding between classes of different lengths).
    """
    mask = inputs["attention_mask"]
    batch, encoded, scores = mask.shape[0], None, []
    for ids in targets:
        labels = torch.tensor(ids, device=mask.device).repeat(batch, 1)
        with autocast(precision, mask.device):
            out = model(**inputs, encoder_outputs=encoded, labels=labels)
        if encoded is None:  # later classes reuse the encoder's states
            encoded = BaseModelOutput(last_hidden_state=out.encoder_last_hidden_state)
        log_probs = out.logits.float().log_softmax(-1)
        scores.append(log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1).sum(-1))
    return torch.stack(scores, dim=1)


def rank_predictions(
    model: torch.nn.Module, inputs: dict, targets: list[list[int]], precision: str = "fp32"
) -> np.ndarray:
    """The class of highest log-likelihood for each input (int64 class ids; ties: the lower
    id)."""
    return class_log_likelihoods(model, inputs, targets, precision).argmax(-1).cpu().numpy()
