"""lm-evaluation-harness scores a tiny trained smelt model through its Hugging Face export, offline,
on a last-word cloze task built from the held-out documents; its numbers equal smelt's own."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")

from tasks import storage  # noqa: E402
from tasks.eval.config import HarnessConfig  # noqa: E402
from tasks.eval.evaluate import load_model  # noqa: E402
from tasks.eval.harness import cloze_items, held_out_documents, score_with_harness  # noqa: E402
from tasks.tokenizer_files import load_tokenizer  # noqa: E402
from tasks.train.export import export_checkpoint  # noqa: E402
from tests.tasks.train.test_hf import make_tokens, train_small  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                                           "ignore::UserWarning")]


def smelt_cloze_scores(model, tokenizer, items: list[dict]) -> dict:
    """acc (greedy reproduces the target) and perplexity (exp of minus the mean target log-likelihood)."""
    greedy, loglik = [], []
    for item in items:
        context = tokenizer.encode(item["context"]).ids
        whole = tokenizer.encode(item["context"] + item["target"]).ids
        target = whole[len(context):]
        with torch.no_grad():
            logprobs = model(torch.tensor([whole[:-1]]))[0, -len(target):].log_softmax(-1)
        loglik.append(sum(logprobs[i, t].item() for i, t in enumerate(target)))
        greedy.append(logprobs.argmax(-1).tolist() == target)
    return {"acc": sum(greedy) / len(items), "perplexity": math.exp(-sum(loglik) / len(items))}


def test_cloze_items_cut_before_an_alphabetic_word():
    cfg = HarnessConfig(min_words=3, max_words=6, docs=2)
    items = cloze_items(["one two three four five six seven", "too short", "a b c d 42"], cfg)
    assert items == [{"context": "one two three four five", "target": " six"},
                     {"context": "a b c", "target": " d"}]


def test_lm_eval_scores_the_export_and_writes_its_results_into_the_eval_dataset(tmp_path):
    tokens = make_tokens(tmp_path / "data")
    run = train_small(tokens, str(tmp_path / "run"), steps=12)
    step_url = storage.normalize_url(run) + "/checkpoints/step-00000012"
    cfg = HarnessConfig(enabled=True, docs=12, min_words=6, max_words=24, batch_size=4)
    export_checkpoint(step_url, str(tmp_path / "export"), dtype="fp32")  # what the eval flow does first
    shards, results = score_with_harness(str(tmp_path / "export"), tokens, cfg, str(tmp_path / "eval"))

    assert {s.name for s in shards} == {"harness.json", "harness_task.yaml", "harness_cloze.jsonl"}
    assert json.loads((tmp_path / "eval" / "harness.json").read_text())["metrics"] == results["metrics"]
    assert results["items"] == 12 and results["model"] == "hf" and results["checkpoint"] == step_url
    tokenizer = load_tokenizer(tokens)
    texts = [tokenizer.decode(d) for d in held_out_documents(tokens, cfg.max_tokens)]
    items = cloze_items(texts, cfg)
    assert [json.loads(line) for line in (tmp_path / "eval" / "harness_cloze.jsonl").read_text().splitlines()] == items
    expected = smelt_cloze_scores(load_model(step_url)[0], tokenizer, items)
    assert results["metrics"]["acc"] == pytest.approx(expected["acc"])
    assert results["metrics"]["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-4)
