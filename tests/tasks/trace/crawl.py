"""A small crawl with planted pages, run through the real stages (ingest, dedup, tokenize) and a tiny trainer.

The planted kind: prose pages whose longer words have their letters shuffled (stop words and punctuation kept,
so the pages pass the language and quality filters). Their words are not in the tokenizer's merges, so a
model that has learnt the ordinary pages' tokens finds them far harder: the sequences they fill stand out.
"""

from __future__ import annotations

import json
import os
import random

from tasks.config import from_dict
from tasks.dedup.config import DedupConfig
from tasks.dedup.stage import run_dedup
from tasks.ingest.config import IngestConfig
from tasks.ingest.readers import expand_inputs
from tasks.ingest.stage import run_ingest
from tasks.sample.content import ProseStream, prose_page
from tasks.tokenize.config import TokenizeConfig, TokenizerConfig
from tasks.tokenize.stage import run_tokenize
from tasks.tokenize.tokenizer import train_tokenizer
from tasks.train.config import TrainConfig
from tasks.train.faults import fault_callbacks
from tasks.train.trainer import Trainer

PLANTED_HOST = "https://planted.example/"


def _shuffle_letters(word: str, rng: random.Random) -> str:
    core = word.strip(".,;:!?()\"'")
    if len(core) < 5 or not core.isalpha():
        return word
    letters = list(core)
    rng.shuffle(letters)
    return word.replace(core, "".join(letters), 1)


def write_crawl(folder: str, pages: int, planted: int, seed: int = 0) -> list[str]:
    """``pages`` prose pages and ``planted`` letter-shuffled ones, as JSONL; returns the planted URLs."""
    rng = random.Random(seed)
    stream = ProseStream(random.Random(seed))
    rows, urls = [], []
    planted_at = set(rng.sample(range(pages + planted), planted))
    for n in range(pages + planted):
        content = prose_page(stream, rng)
        text = "\n\n".join(content.paragraphs)
        if n in planted_at:
            text = "\n\n".join(" ".join(_shuffle_letters(w, rng) for w in p.split(" ")) for p in content.paragraphs)
            url = f"{PLANTED_HOST}page-{n}"
            urls.append(url)
        else:
            url = f"https://docs.example/page-{n}"
        rows.append({"id": f"page-{n}", "url": url, "text": text, "source": "web"})
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "crawl.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return urls


def build(root: str, *, pages: int = 160, planted: int = 8) -> dict:
    """Crawl -> ingest -> dedup -> tokenizer -> tokens; returns the URLs of every stage and the planted pages."""
    planted_urls = write_crawl(os.path.join(root, "crawl"), pages, planted)
    ingest_cfg = from_dict(IngestConfig, {"pii": {"enabled": False}})
    docs = run_ingest(expand_inputs([os.path.join(root, "crawl")]), os.path.join(root, "ingest"), ingest_cfg,
                      fingerprint="ingest")
    deduped = run_dedup([docs], os.path.join(root, "dedup"), DedupConfig(), fingerprint="dedup")
    tokenizer = train_tokenizer([deduped], os.path.join(root, "tokenizer"),
                                TokenizerConfig(vocab_size=600, min_frequency=2), fingerprint="tokenizer")
    tokens = run_tokenize([deduped], tokenizer.meta["url"], os.path.join(root, "tokens"),
                          TokenizeConfig(val_fraction=0.0), fingerprint="tokens")
    return {"ingest": docs, "dedup": deduped, "tokens": tokens, "planted": planted_urls}


TINY = {
    "model": {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 128},
    "data": {"seq_len": 64, "global_batch": 8, "prefetch": 0},
    "optim": {"lr": 3e-3, "warmup_steps": 2},
    "checkpoint": {"interval_steps": 10, "async_mode": "off"},
    "steps": 200,
}


def train(tokens_url: str, run_dir: str, **sections) -> dict:
    cfg = json.loads(json.dumps(TINY))
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values} if isinstance(values, dict) else values
    train_cfg = from_dict(TrainConfig, cfg)
    with Trainer(train_cfg, {"web": tokens_url}, run_dir, callbacks=fault_callbacks(train_cfg.faults, run_dir, 0)) as trainer:
        return trainer.train()
