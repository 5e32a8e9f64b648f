"""Where prompts start: the backbone's most frequent real tokens (``init: vocab``), a text
(``init: text``), and DePT's low-rank start (``lowrank_init``).

The tiny models borrow the packaged MiniLM's tokenizer (BERT WordPiece), so both are checked on
it; the SentencePiece (T5, LLaMA) and byte-level BPE (GPT-2) layouts, whose tokenizers are not
installable here, on in-memory vocabularies laid out as theirs are.
"""

from __future__ import annotations

import math

import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from raypeft.config.schema import ModelConfig
from raypeft.methods import BackboneDims, build_method
from raypeft.methods.dept import OFFICIAL_LORA_ALPHA, DePTConfig, lowrank_a
from raypeft.methods.prompt_init import FREQUENT_TOKENS, frequent_token_ids, init_prompt
from raypeft.methods.prompt_tuning import PromptTuningConfig
from raypeft.modeling.backbones import load_backbone, load_tokenizer
from raypeft.modeling.prompted import PromptedModel

DEPT_TEXT = "Classify this text is postive or not:"  # DePT's default init text, typo included


def layout(pieces: list[str], specials: dict[str, str], extra: list[str] = ()):
    """A fast tokenizer whose ids are ``pieces`` then ``extra`` (added special tokens), in
    order: a family's vocabulary layout, for :func:`frequent_token_ids`."""
    vocab = {piece: i for i, piece in enumerate([*pieces, *extra])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=specials.get("unk_token")))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, additional_special_tokens=list(extra), **specials
    )


def tokens(tokenizer, ids) -> list[str]:
    return tokenizer.convert_ids_to_tokens(list(ids))


# ------------------------------------------------------------------ the frequent real tokens


@pytest.mark.parametrize("name", ["minilm", "tiny-bert"])
def test_wordpiece_frequency_order_starts_after_unused_and_single_characters(name):
    tokenizer = load_tokenizer(name)  # the tiny models borrow the packaged MiniLM's
    ids = frequent_token_ids(tokenizer)
    assert len(ids) == FREQUENT_TOKENS and list(ids) == sorted(set(ids))
    # [PAD] 0, [unused0-98] 1-99, [UNK] [CLS] [SEP] [MASK] 100-103, [unused99-993] 104-998,
    # single characters 999-1995: frequency order starts at "the" (1996)
    assert ids[:6] == (1996, 1997, 1998, 1999, 2000, 2001)
    assert tokens(tokenizer, ids[:6]) == ["the", "of", "and", "in", "to", "was"]
    texts = tokens(tokenizer, ids)
    assert not any(t.startswith("[") for t in texts)  # no [unusedN] or special token
    assert all(len(t.removeprefix("##")) > 1 for t in texts)  # "##s" and "a" are left out
    assert "##ing" in texts and "people" in texts


def test_sentencepiece_t5_layout_skips_specials_characters_and_sentinels():
    # t5-base: <pad> </s> <unk>, then pieces by score (single characters among them), then
    # the 100 sentinels <extra_id_N>; its embedding table has 28 rows more than the tokenizer
    pieces = ["<pad>", "</s>", "<unk>", "▁", "X", ".", ",", "s", "▁the", "▁a", "▁to", "▁and", "ing"]
    sentinels = [f"<extra_id_{i}>" for i in range(3)]
    specials = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    tokenizer = layout(pieces, specials, sentinels)
    ids = frequent_token_ids(tokenizer)
    assert tokens(tokenizer, ids) == ["▁the", "▁to", "▁and", "ing"]
    # rows past the tokenizer's length (T5's untrained 32100-32127) are never drawn
    table = torch.nn.Embedding(len(tokenizer) + 28, 4)
    prompt = init_prompt(4, table, "vocab", seed=0, tokenizer=tokenizer)
    drawn = {_row_id(table, row) for row in prompt}
    assert drawn == set(ids)


def test_sentencepiece_byte_fallback_layout_skips_the_byte_rows():
    # LLaMA: <unk> <s> </s>, then the 256 byte-fallback rows <0x00>..<0xFF>, then merges
    # (and whitespace runs such as "▁▁", a single character past its marker)
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    pieces = ["<unk>", "<s>", "</s>", *bytes_, "▁▁", "▁t", "er", "▁th"]
    specials = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    tokenizer = layout(pieces, specials)
    assert tokens(tokenizer, frequent_token_ids(tokenizer)) == ["er", "▁th"]


def test_byte_level_bpe_layout_skips_the_byte_alphabet():
    # GPT-2: the 256 byte symbols first, then the merges in order, <|endoftext|> last
    alphabet = [chr(c) for c in range(33, 127)] + ["Ġ", "Ċ"]
    merges = ["Ġt", "Ġa", "he", "in", "Ġthe", "âĢ"]
    tokenizer = layout([*alphabet, *merges, "<|endoftext|>"], {"eos_token": "<|endoftext|>"})
    assert tokens(tokenizer, frequent_token_ids(tokenizer)) == ["he", "in", "Ġthe", "âĢ"]


# ------------------------------------------------------------------ init: vocab


def _row_id(table: torch.nn.Embedding, row: torch.Tensor) -> int:
    """The id of the embedding row equal to ``row`` (it must be exactly one row)."""
    (match,) = torch.nonzero((table.weight == row).all(dim=1)).flatten().tolist()
    return match


def test_pt_starts_from_distinct_frequent_tokens_of_its_backbone(tiny_backbone):
    backbone = tiny_backbone()
    model = PromptedModel(backbone, PromptTuningConfig(prompt_length=40, init_seed=5))
    frequent = set(frequent_token_ids(backbone.tokenizer()))
    drawn = [_row_id(backbone.word_embeddings, row) for row in model.method.prompt.detach()]
    assert set(drawn) <= frequent and len(set(drawn)) == 40  # no token twice (Lester et al.)
    # another seed, other tokens; the same seed, the same prompt
    other = PromptedModel(tiny_backbone(), PromptTuningConfig(prompt_length=40, init_seed=6))
    again = PromptedModel(tiny_backbone(), PromptTuningConfig(prompt_length=40, init_seed=5))
    assert not torch.equal(other.method.prompt, model.method.prompt)
    assert torch.equal(again.method.prompt, model.method.prompt)


def test_every_vocab_initialised_prompt_reads_the_tokenizer(tiny_backbone):
    # PT, DePT, deep prompts (hidden) and IDPG's task prompts all start from frequent tokens
    from raypeft.methods.deep_prompts import DeepPromptConfig
    from raypeft.methods.idpg.method import IDPGConfig

    backbone = tiny_backbone()
    frequent = set(frequent_token_ids(backbone.tokenizer()))
    table = backbone.word_embeddings
    cases = {
        "dept": (DePTConfig(prompt_length=6, rank=2), lambda m: m.prompt),
        "prefix": (DeepPromptConfig(prompt_length=3), lambda m: m.prompts.flatten(0, 1)),
        "idpg": (IDPGConfig(prompt_length=3), lambda m: m.prompt_bias.reshape(-1, 32)),
    }
    for name, (cfg, rows) in cases.items():
        method = PromptedModel(tiny_backbone(), cfg).method
        drawn = {_row_id(table, row) for row in rows(method).detach()}
        assert drawn <= frequent, name


def test_a_method_built_without_a_tokenizer_draws_from_every_row():
    dims = BackboneDims(hidden_size=8, num_layers=1, vocab_size=50, max_length=8)
    table = torch.nn.Embedding(50, 8)
    method = build_method(PromptTuningConfig(prompt_length=50), dims, table)
    assert sorted(_row_id(table, row) for row in method.prompt.detach()) == list(range(50))


def test_a_prompt_longer_than_the_population_draws_with_replacement():
    tokenizer = layout(["<unk>", "the", "of", "and"], {"unk_token": "<unk>"})
    table = torch.nn.Embedding(4, 3)
    prompt = init_prompt(7, table, "vocab", seed=0, tokenizer=tokenizer)
    assert {_row_id(table, row) for row in prompt} <= {1, 2, 3}
    nothing = layout(["<unk>", "a", "b"], {"unk_token": "<unk>"})
    with pytest.raises(ValueError, match="no real token"):
        init_prompt(2, torch.nn.Embedding(3, 3), "vocab", seed=0, tokenizer=nothing)


def test_vocab_uniform_is_the_earlier_rule_for_ablations(tiny_backbone):
    # any row of the upper 90% of the table, with replacement: [unusedN] rows included
    table = tiny_backbone().word_embeddings
    prompt = init_prompt(30, table, "vocab_uniform", seed=4)
    ids = torch.randint(30522 // 10, 30522, (30,), generator=torch.Generator().manual_seed(4))
    assert torch.equal(prompt, table.weight[ids].float())


# ------------------------------------------------------------------ init: text


@pytest.mark.parametrize("length", [4, 11, 25])
def test_text_init_repeats_the_texts_ids_to_length(tiny_backbone, length):
    backbone = tiny_backbone()
    cfg = PromptTuningConfig(prompt_length=length, init="text", init_text=DEPT_TEXT)
    prompt = PromptedModel(backbone, cfg).method.prompt.detach()
    ids = backbone.tokenizer()(DEPT_TEXT)["input_ids"]  # [CLS] ... [SEP]: 11 ids
    assert len(ids) == 11 and ids[0] == 101 and ids[-1] == 102
    expected = (ids * 3)[:length]
    assert [_row_id(backbone.word_embeddings, row) for row in prompt] == expected


def test_text_init_equals_peft_prompt_tuning_init_text(tiny_backbone):
    """The same prompt as Hugging Face peft's ``PromptTuningInit.TEXT`` (whose code DePT's
    copies), on the same embedding table and tokenizer."""
    peft = pytest.importorskip("peft")
    from raypeft.modeling.backbones import resolve_source, tokenizer_name

    backbone = tiny_backbone()
    for length, text in ((30, DEPT_TEXT), (5, "negative or positive")):
        config = peft.PromptTuningConfig(
            task_type="SEQ_CLS",
            num_virtual_tokens=length,
            token_dim=32,
            num_transformer_submodules=1,
            prompt_tuning_init="TEXT",
            prompt_tuning_init_text=text,
            tokenizer_name_or_path=resolve_source(tokenizer_name("tiny-bert")),
        )
        theirs = peft.PromptEmbedding(config, backbone.word_embeddings).embedding.weight
        cfg = DePTConfig(prompt_length=length, rank=2, init="text", init_text=text)
        ours = PromptedModel(tiny_backbone(), cfg).method.prompt
        assert torch.equal(ours.detach(), theirs.detach())


def test_text_init_on_the_packaged_minilm():
    backbone = load_backbone(ModelConfig(name="minilm", max_length=16), 2, "classification")
    cfg = PromptTuningConfig(prompt_length=3, init="text", init_text="great movie")
    prompt = PromptedModel(backbone, cfg).method.prompt.detach()
    ids = [_row_id(backbone.word_embeddings, row) for row in prompt]
    assert backbone.tokenizer().convert_ids_to_tokens(ids) == ["[CLS]", "great", "movie"]


# ------------------------------------------------------------------ DePT's low-rank start

T5_BASE = BackboneDims(hidden_size=768, num_layers=12, vocab_size=32128, max_length=256)


@pytest.mark.parametrize("rank", [15, 60])
def test_official_lowrank_start_is_loras_kaiming_uniform_and_scale(rank):
    table = torch.nn.Embedding(100, 768)
    cfg = DePTConfig(prompt_length=20, rank=rank, init="normal")
    method = build_method(cfg, T5_BASE, table)
    a = method.lora_a.detach()
    bound = 1 / math.sqrt(rank)  # kaiming_uniform_(a=√5) on (s, r): U(±1/√r)
    assert a.shape == (256, rank) and a.abs().max() <= bound
    assert a.abs().max() > 0.95 * bound
    assert a.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    expected = torch.nn.init.kaiming_uniform_(
        torch.empty(256, rank), a=math.sqrt(5), generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(a, expected)  # the official draw, from seed init_seed + 1
    assert torch.equal(method.lora_b, torch.zeros(rank, 768))
    assert method.scaling == OFFICIAL_LORA_ALPHA / math.sqrt(rank) == 8 / math.sqrt(rank)


def test_paper_lowrank_start_is_gaussian_and_unscaled():
    table = torch.nn.Embedding(100, 768)
    cfg = DePTConfig(prompt_length=20, rank=60, init="normal", lowrank_init="paper")
    method = build_method(cfg, T5_BASE, table)
    assert method.lora_a.std().item() == pytest.approx(1 / math.sqrt(60), rel=0.05)
    assert torch.equal(method.lora_a.detach(), lowrank_a(256, 60, "paper", 1))
    assert method.scaling == 1.0 and torch.equal(method.lora_b, torch.zeros(60, 768))


def test_lowrank_init_changes_no_count_and_no_checkpoint_key(tiny_backbone):
    official = PromptedModel(tiny_backbone(), DePTConfig(prompt_length=4, rank=3))
    paper = PromptedModel(
        tiny_backbone(), DePTConfig(prompt_length=4, rank=3, lowrank_init="paper")
    )
    a, b = official.trainable_state_dict(), paper.trainable_state_dict()
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    assert official.method.num_trainable() == paper.method.num_trainable() == 4 * 32 + 48 * 3
