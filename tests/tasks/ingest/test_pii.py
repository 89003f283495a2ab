import pickle

from tasks.counters import Stats
from tasks.documents import Document
from tasks.ingest.config import PIIConfig
from tasks.ingest.pii import PIIMasker

EMAILS = {"email@example.com", "firstname.lastname@example.org"}
IPV4S = {"192.0.2.1", "198.51.100.1", "203.0.113.1"}


def mask(text: str, **overrides) -> tuple[str, int, int]:
    return PIIMasker(PIIConfig(**overrides)).mask(text)


def test_emails_are_replaced_by_example_addresses():
    text, emails, ips = mask("Write to John.Doe+news@mail.co.uk today.")
    assert emails == 1 and ips == 0
    replaced = text[len("Write to ") : -len(" today.")]
    assert replaced in EMAILS


def test_public_ipv4_addresses_are_masked_and_private_ones_are_not():
    text, _, ips = mask("dns 8.8.8.8, lan 192.168.1.10, 10.0.0.1, loopback 127.0.0.1, any 0.0.0.0")
    assert ips == 1
    assert "8.8.8.8" not in text and text.split(",")[0][len("dns ") :] in IPV4S
    assert "192.168.1.10" in text and "10.0.0.1" in text and "127.0.0.1" in text and "0.0.0.0" in text


def test_private_ips_are_masked_when_only_public_is_off():
    text, _, ips = mask("lan 192.168.1.10", only_public_ips=False)
    assert ips == 1 and "192.168.1.10" not in text


def test_ipv6_addresses_are_masked_when_public():
    text, _, ips = mask("resolver 2001:4860:4860::8888 and local ::1 and fe80::1")
    assert ips == 1
    assert text == "resolver 2001:db8::1 and local ::1 and fe80::1"


def test_things_that_look_like_addresses_are_left_alone():
    text = "version 1.2.3.4.5, score 999.1.1.1, time 12:30:45, ratio 3:2, user@localhost, a@b"
    assert mask(text) == (text, 0, 0)


def test_the_same_address_always_gets_the_same_replacement():
    first, _, _ = mask("from 8.8.4.4")
    second, _, _ = mask("to 8.8.4.4 and again 8.8.4.4")
    replacement = first.split()[-1]
    assert second == f"to {replacement} and again {replacement}"


def test_masking_twice_changes_nothing_more():
    once, emails, ips = mask("mail ann@corp.com at 1.1.1.1 or 2606:4700:4700::1111")
    assert (emails, ips) == (1, 2)
    assert mask(once) == (once, 0, 0)


def test_each_kind_can_be_switched_off():
    text = "ann@corp.com 1.1.1.1 2606:4700:4700::1111"
    assert mask(text, mask_emails=False)[1:] == (0, 2)
    assert mask(text, mask_ips=False)[1:] == (1, 1)
    assert mask(text, mask_ipv6=False)[1:] == (1, 1)


def test_custom_replacements_are_used():
    text, _, _ = mask("ann@corp.com 1.1.1.1", email_replacements=["x@example.net"], ipv4_replacements=["203.0.113.9"])
    assert text == "x@example.net 203.0.113.9"


def test_step_counts_masked_items_and_documents_with_pii():
    stats = Stats()
    docs = [
        Document(id="a", url="", text="Contact ann@corp.com or bob@corp.com from 1.1.1.1."),
        Document(id="b", url="", text="Nothing personal here."),
    ]
    out = list(PIIMasker(PIIConfig()).run(docs, stats))
    assert [d.id for d in out] == ["a", "b"]
    assert "ann@corp.com" not in out[0].text and out[1].text == "Nothing personal here."
    assert stats == {"in": 2, "out": 2, "docs_with_pii": 1, "emails_masked": 2, "ips_masked": 1}


def test_disabled_masker_passes_documents_untouched():
    stats = Stats()
    doc = Document(id="a", url="", text="ann@corp.com")
    assert list(PIIMasker(PIIConfig(enabled=False)).run([doc], stats)) == [doc]
    assert doc.text == "ann@corp.com" and stats == {}


def test_masker_pickles():
    step = pickle.loads(pickle.dumps(PIIMasker(PIIConfig())))
    assert step.mask("1.1.1.1")[2] == 1
