"""PII masking: e-mail addresses and IP addresses are replaced, as in FineWeb.

Only public (globally routable) IPs are masked by default: private, loopback, link-local and
reserved addresses identify nobody and are common in documentation and code. Replacements come
from reserved example ranges, and each address maps to a replacement chosen by a hash of the
address, so the output does not depend on document order and a second pass changes nothing.
"""

from __future__ import annotations

import ipaddress
import re
import zlib
from collections.abc import Iterable, Iterator

from tasks.counters import Stats
from tasks.documents import Document
from tasks.ingest.base import Step
from tasks.ingest.config import PIIConfig

EMAIL_RE = re.compile(
    r"(?<![\w.+-])"  # not in the middle of a longer token
    r"[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*"  # local part
    r"@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+[a-z]{2,63}\b",  # domain with an alphabetic TLD
    re.IGNORECASE,
)
# Four dotted numbers not embedded in a longer dotted number ("1.2.3.4.5" is a version, not an
# address); ipaddress then rejects octets over 255. Python's re is slow on such patterns, so texts
# are first checked for a digit-dot-digit at all.
IPV4_HINT_RE = re.compile(r"[0-9]\.[0-9]")
IPV4_RE = re.compile(r"(?<![0-9.])[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?!\.?[0-9])")
# Candidates only: colon-separated hex groups; ipaddress decides what is a real IPv6 address.
IPV6_RE = re.compile(r"(?<![\w:.])(?:[0-9a-f]{0,4}:){2,7}[0-9a-f]{0,4}(?![\w:])", re.IGNORECASE)


def pick(replacements: list[str], found: str) -> str:
    """The replacement for ``found``: stable across runs and documents."""
    return replacements[zlib.crc32(found.encode()) % len(replacements)]


def is_maskable_ip(candidate: str, only_public: bool) -> bool:
    try:
        address = ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return address.is_global or not only_public


class PIIMasker(Step):
    """Masks e-mail and IP addresses in ``doc.text``.

    Counters: ``emails_masked``, ``ips_masked`` (IPv4 and IPv6), ``docs_with_pii`` (documents
    where anything was masked).
    """

    name = "pii"
    cfg: PIIConfig

    def mask(self, text: str) -> tuple[str, int, int]:
        """(masked text, e-mails masked, IPs masked)."""
        cfg = self.cfg
        emails = ips = 0

        def mask_email(m: re.Match) -> str:
            nonlocal emails
            if m.group(0).lower() in (r.lower() for r in cfg.email_replacements):
                return m.group(0)
            emails += 1
            return pick(cfg.email_replacements, m.group(0).lower())

        def mask_ip(replacements: list[str]):
            def replace(m: re.Match) -> str:
                nonlocal ips
                found = m.group(0)
                if found in replacements or not is_maskable_ip(found, cfg.only_public_ips):
                    return found
                ips += 1
                return pick(replacements, found)

            return replace

        if cfg.mask_emails and "@" in text:
            text = EMAIL_RE.sub(mask_email, text)
        if cfg.mask_ipv6 and ("::" in text or text.count(":") >= 7):  # cheap pre-check
            text = IPV6_RE.sub(mask_ip(cfg.ipv6_replacements), text)
        if cfg.mask_ips and IPV4_HINT_RE.search(text):
            text = IPV4_RE.sub(mask_ip(cfg.ipv4_replacements), text)
        return text, emails, ips

    def process(self, docs: Iterable[Document], stats: Stats, rejects: list[Document] | None) -> Iterator[Document]:
        for doc in docs:
            doc.text, emails, ips = self.mask(doc.text)
            if emails or ips:
                stats.add("docs_with_pii")
                stats.add("emails_masked", emails)
                stats.add("ips_masked", ips)
            yield doc
