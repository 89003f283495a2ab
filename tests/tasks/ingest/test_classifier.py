import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks import contract, storage
from tasks.counters import Stats
from tasks.documents import document_schema
from tasks.documents import Document
from tasks.ingest.classifier import (
    QualityClassifierFilter,
    normalize_for_classifier,
    train_classifier_from_datasets,
    train_quality_classifier,
)
from tasks.ingest.config import ClassifierConfig

SCIENCE = "experiment hypothesis measured results analysis theory observation evidence method data".split()
SPAM = "click free winner cheap deal bonus prize offer subscribe limited".split()

# Small and fast: this trains in well under a second.
TINY = dict(dim=16, bucket=10_000, epoch=25, lr=0.2, valid_fraction=0.2)


def synthetic(vocabulary: list[str], n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(vocabulary) for _ in range(12)) for _ in range(n)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("classifier") / "quality.bin"
    report = train_quality_classifier(synthetic(SCIENCE, 50, 1), synthetic(SPAM, 50, 2), str(out), ClassifierConfig(**TINY))
    return out, report


def test_the_installed_fasttext_can_train():
    import fasttext

    assert hasattr(fasttext, "train_supervised")


def test_training_separates_a_separable_set_and_reports_held_out_metrics(trained):
    path, report = trained
    assert path.exists() and path.stat().st_size > 0
    assert report["model_url"] == f"file://{path}"
    assert report["train_docs"] == {"hq": 40, "lq": 40}
    assert report["held_out_docs"] == {"hq": 10, "lq": 10}
    assert report["precision"] >= 0.9 and report["recall"] >= 0.9 and report["f1"] >= 0.9


def test_filter_scores_documents_and_drops_low_quality(trained):
    path, _ = trained
    step = QualityClassifierFilter(ClassifierConfig(enabled=True, model_url=str(path)))
    good = Document(id="good", url="", text="The experiment measured results.\nAnalysis of the evidence supports the theory.")
    bad = Document(id="bad", url="", text="CLICK for a FREE prize!\nWinner bonus offer, limited deal.")
    code = Document(id="code", url="", text="click free winner", source="code")
    stats, rejects = Stats(), []
    kept = list(step.run([good, bad, code], stats, rejects))
    assert [d.id for d in kept] == ["good", "code"]
    assert good.quality_score > 0.5 > bad.quality_score
    assert math.isnan(code.quality_score)
    assert [d.meta["dropped_by"] for d in rejects] == ["quality_classifier_low"]
    assert stats == {"in": 3, "out": 2, "dropped.quality_classifier_low": 1, "skipped.code": 1}


def test_a_score_equal_to_the_threshold_is_kept(trained):
    path, _ = trained
    doc = Document(id="d", url="", text="hypothesis data click")
    list(QualityClassifierFilter(ClassifierConfig(enabled=True, model_url=str(path), threshold=0.0)).run([doc], Stats()))
    score = doc.quality_score
    at = QualityClassifierFilter(ClassifierConfig(enabled=True, model_url=str(path), threshold=score))
    above = QualityClassifierFilter(ClassifierConfig(enabled=True, model_url=str(path), threshold=min(1.0, score + 1e-6)))
    assert len(list(at.run([Document(id="d", url="", text=doc.text)], Stats()))) == 1
    assert list(above.run([Document(id="d", url="", text=doc.text)], Stats())) == []


def test_a_model_without_the_positive_label_is_a_clear_error(trained):
    path, _ = trained
    step = QualityClassifierFilter(ClassifierConfig(enabled=True, model_url=str(path), positive_label="good"))
    with pytest.raises(ValueError, match="has no label 'good'"):
        list(step.run([Document(id="d", url="", text="data")], Stats()))


def test_enabling_the_classifier_needs_an_existing_model(tmp_path):
    with pytest.raises(ValueError, match="model_url is empty"):
        ClassifierConfig(enabled=True)
    with pytest.raises(ValueError, match="does not exist"):
        QualityClassifierFilter(ClassifierConfig(enabled=True, model_url=str(tmp_path / "none.bin")))


def test_disabled_classifier_passes_everything():
    doc = Document(id="d", url="", text="anything")
    stats = Stats()
    assert list(QualityClassifierFilter(ClassifierConfig()).run([doc], stats)) == [doc]
    assert stats == {} and math.isnan(doc.quality_score)


def test_too_few_documents_to_hold_out_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="too few 'lq' documents"):
        train_quality_classifier(synthetic(SCIENCE, 20, 1), ["cheap deal", "", "  "], str(tmp_path / "m.bin"), ClassifierConfig(**TINY))


def test_normalization_makes_one_lowercase_line_of_capped_length():
    cfg = ClassifierConfig(max_chars=12)
    assert normalize_for_classifier("Hello\n\n  World\tand more", cfg) == "hello wor"  # capped before spaces are collapsed
    assert normalize_for_classifier("bad \ud800 byte", cfg) == "bad ? byte"


def write_documents(url: str, texts: list[str]) -> None:
    def write(f) -> int:
        rows = [Document(id=str(i), url="", text=t).to_row() for i, t in enumerate(texts)]
        table = pa.Table.from_pylist(rows, schema=document_schema())
        pq.write_table(table, f)
        return len(rows)

    shard = contract.write_shard(url, "docs-00000.parquet", write)
    contract.commit(url, "documents", "test", [shard], {"docs": len(texts)})


def test_training_from_documents_datasets_writes_the_model_to_a_url():
    write_documents("memory://test-classifier/positive", synthetic(SCIENCE, 30, 3))
    write_documents("memory://test-classifier/negative", synthetic(SPAM, 30, 4))
    cfg = ClassifierConfig(**TINY, max_docs_per_class=25)
    report = train_classifier_from_datasets(
        "memory://test-classifier/positive", "memory://test-classifier/negative", "memory://test-classifier/out/model.bin", cfg
    )
    assert report["train_docs"] == {"hq": 20, "lq": 20} and report["held_out_docs"] == {"hq": 5, "lq": 5}
    assert report["positive_dataset"] == "memory://test-classifier/positive"
    assert report["recall"] >= 0.8
    fs, path = storage.filesystem("memory://test-classifier/out/model.bin")
    assert fs.size(path) > 0

    step = QualityClassifierFilter(ClassifierConfig(enabled=True, model_url="memory://test-classifier/out/model.bin"))
    kept = list(step.run([Document(id="d", url="", text="experiment data analysis results")], Stats()))
    assert kept and kept[0].quality_score > 0.5


def test_training_from_a_corrupted_documents_shard_names_the_shard():
    url = "memory://test-classifier/corrupt"
    write_documents(url, synthetic(SCIENCE, 30, 5))
    fs, path = storage.filesystem(url + "/docs-00000.parquet")
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    fs.pipe_file(path, bytes(data))
    with pytest.raises(contract.DatasetError, match="docs-00000.parquet"):
        train_classifier_from_datasets(url, "memory://test-classifier/negative", "memory://y.bin", ClassifierConfig(**TINY))


def test_training_from_a_missing_dataset_names_it():
    with pytest.raises(contract.DatasetError, match="memory://test-classifier/nothing"):
        train_classifier_from_datasets("memory://test-classifier/nothing", "memory://x", "memory://y.bin", ClassifierConfig(**TINY))


def test_quantized_models_are_smaller_and_still_classify(tmp_path):
    texts = synthetic(SCIENCE, 50, 1), synthetic(SPAM, 50, 2)
    small = {**TINY, "bucket": 1000}
    full = train_quality_classifier(*texts, str(tmp_path / "quality.bin"), ClassifierConfig(**small))
    quantized = train_quality_classifier(*texts, str(tmp_path / "quality.ftz"), ClassifierConfig(**small, quantize=True))
    assert (tmp_path / "quality.ftz").stat().st_size < (tmp_path / "quality.bin").stat().st_size
    assert quantized["f1"] >= 0.9 and full["f1"] >= 0.9


def test_training_is_deterministic_whatever_the_heap_held_before(tmp_path):
    # fastText 0.9.3 leaves most of a small input matrix uninitialized; freed random bytes used to
    # leak into the model (different weights, or "Encountered NaN").
    texts = synthetic(SCIENCE, 30, 5), synthetic(SPAM, 30, 6)
    train_quality_classifier(*texts, str(tmp_path / "a.bin"), ClassifierConfig(**TINY))
    for size in (300_000, 700_000, 1_500_000):
        garbage = bytearray(random.Random(size).randbytes(size))
        del garbage
    train_quality_classifier(*texts, str(tmp_path / "b.bin"), ClassifierConfig(**TINY))
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
