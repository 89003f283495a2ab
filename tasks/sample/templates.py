"""HTML for the sample crawl: an article wrapped in the boilerplate real sites put around it.

The main content always sits in ``<article>``; around it every page carries what text
extraction has to throw away: a cookie banner ("We use cookies…"), header and ``<nav>`` menus,
a sidebar of related links, share and feedback widgets, a footer with a copyright line, and
script tags. Sites differ in layout, wording and language of these parts, so the extractor is
not tested against one fixed template.
"""

from __future__ import annotations

import dataclasses
import html
import json

LAYOUTS = 3

# Interface wording per site language. English has several cookie texts because real banners
# differ; each one starts with "We use cookies".
UI = {
    "en": {
        "cookies": (
            "We use cookies to personalise content, measure traffic and improve your experience. "
            'By clicking "Accept all" you agree to our use of cookies.',
            "We use cookies and similar technologies to remember your preferences and to understand "
            "how visitors use this site.",
            "We use cookies. Some are essential for the site to work, others help us improve it and "
            "show you relevant offers from our partners.",
        ),
        "accept": "Accept all", "reject": "Reject", "settings": "Cookie settings",
        "privacy": "Privacy policy", "terms": "Terms of use", "about": "About us",
        "contact": "Contact", "home": "Home",
        "nav": ("Guides", "Tutorials", "Reference", "Blog", "Community", "Downloads"),
        "related": "Related pages", "popular": "Popular this week",
        "newsletter": "Get the latest articles in your inbox every week. No spam, unsubscribe any time.",
        "subscribe": "Subscribe", "share": "Share this page", "search": "Search",
        "helpful": "Was this page helpful?", "yes": "Yes", "no": "No",
        "rights": "All rights reserved.",
        "skip": "Skip to main content", "login": "Sign in",
    },
    "de": {
        "cookies": (
            "Wir verwenden Cookies, um Inhalte zu personalisieren und die Zugriffe auf unsere "
            "Website zu analysieren. Mit einem Klick auf „Alle akzeptieren“ stimmen Sie zu.",
        ),
        "accept": "Alle akzeptieren", "reject": "Ablehnen", "settings": "Cookie-Einstellungen",
        "privacy": "Datenschutz", "terms": "Nutzungsbedingungen", "about": "Über uns",
        "contact": "Kontakt", "home": "Startseite",
        "nav": ("Ratgeber", "Reisen", "Kultur", "Küche", "Blog", "Archiv"),
        "related": "Das könnte Sie auch interessieren", "popular": "Meistgelesen",
        "newsletter": "Die neuesten Artikel jede Woche in Ihrem Postfach.",
        "subscribe": "Abonnieren", "share": "Seite teilen", "search": "Suche",
        "helpful": "War dieser Artikel hilfreich?", "yes": "Ja", "no": "Nein",
        "rights": "Alle Rechte vorbehalten.",
        "skip": "Zum Inhalt springen", "login": "Anmelden",
    },
    "fr": {
        "cookies": (
            "Nous utilisons des cookies pour personnaliser le contenu et analyser notre trafic. "
            "En cliquant sur « Tout accepter », vous acceptez leur utilisation.",
        ),
        "accept": "Tout accepter", "reject": "Refuser", "settings": "Paramètres des cookies",
        "privacy": "Politique de confidentialité", "terms": "Conditions d'utilisation",
        "about": "À propos", "contact": "Contact", "home": "Accueil",
        "nav": ("Conseils", "Voyages", "Culture", "Cuisine", "Blog", "Archives"),
        "related": "À lire aussi", "popular": "Les plus lus",
        "newsletter": "Recevez nos derniers articles chaque semaine dans votre boîte mail.",
        "subscribe": "S'abonner", "share": "Partager cette page", "search": "Rechercher",
        "helpful": "Cet article vous a-t-il été utile ?", "yes": "Oui", "no": "Non",
        "rights": "Tous droits réservés.",
        "skip": "Aller au contenu", "login": "Se connecter",
    },
    "es": {
        "cookies": (
            "Utilizamos cookies para personalizar el contenido y analizar el tráfico. "
            "Al hacer clic en «Aceptar todo» aceptas su uso.",
        ),
        "accept": "Aceptar todo", "reject": "Rechazar", "settings": "Configurar cookies",
        "privacy": "Política de privacidad", "terms": "Condiciones de uso",
        "about": "Quiénes somos", "contact": "Contacto", "home": "Inicio",
        "nav": ("Consejos", "Viajes", "Cultura", "Cocina", "Blog", "Archivo"),
        "related": "También te puede interesar", "popular": "Lo más leído",
        "newsletter": "Recibe nuestros últimos artículos cada semana en tu correo.",
        "subscribe": "Suscribirse", "share": "Compartir esta página", "search": "Buscar",
        "helpful": "¿Te ha resultado útil este artículo?", "yes": "Sí", "no": "No",
        "rights": "Todos los derechos reservados.",
        "skip": "Ir al contenido", "login": "Iniciar sesión",
    },
    "it": {
        "cookies": (
            "Utilizziamo i cookie per personalizzare i contenuti e analizzare il traffico. "
            "Facendo clic su «Accetta tutto» acconsenti al loro utilizzo.",
        ),
        "accept": "Accetta tutto", "reject": "Rifiuta", "settings": "Impostazioni cookie",
        "privacy": "Informativa sulla privacy", "terms": "Termini di utilizzo",
        "about": "Chi siamo", "contact": "Contatti", "home": "Home",
        "nav": ("Consigli", "Viaggi", "Cultura", "Cucina", "Blog", "Archivio"),
        "related": "Potrebbe interessarti anche", "popular": "I più letti",
        "newsletter": "Ricevi ogni settimana i nostri ultimi articoli nella tua casella di posta.",
        "subscribe": "Iscriviti", "share": "Condividi questa pagina", "search": "Cerca",
        "helpful": "Questo articolo ti è stato utile?", "yes": "Sì", "no": "No",
        "rights": "Tutti i diritti riservati.",
        "skip": "Vai al contenuto", "login": "Accedi",
    },
}


@dataclasses.dataclass(frozen=True)
class Site:
    """One web site of the sample: where its pages live and how its boilerplate looks."""

    host: str
    name: str
    lang: str
    layout: int
    cookie_text: int
    server: str
    charset: str  # as the site spells it in Content-Type, e.g. "utf-8" or "UTF-8"
    tracking_id: str


def escape(text: str) -> str:
    """Escape text for an element's content (quotes stay as they are, as most sites write them)."""
    return html.escape(text, quote=False)


def attr(value: str) -> str:
    return html.escape(value, quote=True)


def article_html(title: str, paragraphs: list[str]) -> str:
    """The main content: a heading and its paragraphs. Identical input gives identical bytes."""
    body = "\n".join(f"<p>{escape(p)}</p>" for p in paragraphs)
    return f"<article>\n<h1>{escape(title)}</h1>\n{body}\n</article>"


def code_article_html(title: str, intro: str, code: str) -> str:
    """A source listing: an introductory paragraph, then the code in ``<pre><code>``."""
    return (
        f'<article>\n<h1>{escape(title)}</h1>\n<p>{escape(intro)}</p>\n'
        f'<pre><code class="language-python">{escape(code)}</code></pre>\n</article>'
    )


def _links(items: list[tuple[str, str]], cls: str) -> str:
    lis = "".join(f'<li><a href="{attr(href)}">{escape(text)}</a></li>' for href, text in items)
    return f'<ul class="{cls}">{lis}</ul>'


def _cookie_banner(site: Site, ui: dict) -> str:
    text = ui["cookies"][site.cookie_text % len(ui["cookies"])]
    return (
        f'<div id="cookie-banner" class="cookie-consent" role="dialog" aria-live="polite">\n'
        f'<p>{escape(text)} <a href="/privacy.html">{escape(ui["privacy"])}</a></p>\n'
        f'<button type="button" class="btn accept">{escape(ui["accept"])}</button>'
        f'<button type="button" class="btn reject">{escape(ui["reject"])}</button>'
        f'<a class="cookie-settings" href="/cookies.html">{escape(ui["settings"])}</a>\n</div>'
    )


def _head(site: Site, url: str, title: str) -> str:
    ld = json.dumps({"@context": "https://schema.org", "@type": "Article", "headline": title,
                     "publisher": {"@type": "Organization", "name": site.name}}, ensure_ascii=False)
    ld = ld.replace("</", "<\\/")
    return (
        f'<head>\n<meta charset="{site.charset}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)} | {escape(site.name)}</title>\n"
        f'<link rel="canonical" href="{attr(url)}">\n'
        f'<link rel="stylesheet" href="/static/css/site.{site.tracking_id[-6:].lower()}.css">\n'
        f'<script async src="https://tags.example-analytics.net/t.js?id={site.tracking_id}"></script>\n'
        "<script>window.dataLayer = window.dataLayer || []; function track(){dataLayer.push(arguments);} "
        f"track('init', '{site.tracking_id}'); track('pageview');</script>\n"
        f'<script type="application/ld+json">{ld}</script>\n</head>'
    )


def _header(site: Site, ui: dict) -> str:
    nav = [("/", ui["home"])] + [(f"/{label.lower()}/", label) for label in ui["nav"]]
    return (
        f'<a class="skip-link" href="#content">{escape(ui["skip"])}</a>\n'
        f'<header class="site-header">\n<a class="logo" href="/">{escape(site.name)}</a>\n'
        f'<nav class="main-nav" aria-label="Main">{_links(nav, "menu")}</nav>\n'
        f'<form class="search" action="/search" role="search"><input type="search" name="q" '
        f'placeholder="{attr(ui["search"])}"><button>{escape(ui["search"])}</button></form>\n'
        f'<a class="login" href="/login">{escape(ui["login"])}</a>\n</header>'
    )


def _sidebar(ui: dict, related: list[tuple[str, str]]) -> str:
    return (
        f'<aside class="sidebar">\n<h2>{escape(ui["related"])}</h2>\n{_links(related, "related")}\n'
        f'<div class="newsletter"><h2>{escape(ui["subscribe"])}</h2><p>{escape(ui["newsletter"])}</p>'
        f'<form action="/newsletter"><input type="email" name="email"><button>{escape(ui["subscribe"])}'
        "</button></form></div>\n</aside>"
    )


def _footer(site: Site, ui: dict) -> str:
    links = [("/about.html", ui["about"]), ("/contact.html", ui["contact"]),
             ("/privacy.html", ui["privacy"]), ("/terms.html", ui["terms"])]
    return (
        f'<footer class="site-footer">\n<nav aria-label="Footer">{_links(links, "footer-links")}</nav>\n'
        f'<p class="copyright">&copy; 2024 {escape(site.name)}. {escape(ui["rights"])}</p>\n</footer>'
    )


def _share_and_feedback(url: str, ui: dict) -> str:
    shares = [(f"https://social.example.com/share?u={url}", "Facebook"),
              (f"https://microblog.example.com/intent?url={url}", "X"),
              (f"mailto:?subject=&body={url}", "E-mail")]
    return (
        f'<div class="share"><span>{escape(ui["share"])}</span>{_links(shares, "share-links")}</div>\n'
        f'<div class="feedback"><p>{escape(ui["helpful"])}</p><button>{escape(ui["yes"])}</button>'
        f'<button>{escape(ui["no"])}</button></div>'
    )


def render_page(site: Site, url: str, title: str, article: str, related: list[tuple[str, str]]) -> str:
    """A full HTML document for ``article`` in the site's layout and language."""
    ui = UI[site.lang]
    head = _head(site, url, title)
    header, sidebar, footer = _header(site, ui), _sidebar(ui, related), _footer(site, ui)
    cookie = _cookie_banner(site, ui)
    script = f'<script src="/static/js/app.{site.tracking_id[-6:].lower()}.js" defer></script>'
    if site.layout == 0:  # documentation site: banner first, sidebar after the content
        body = (f'{cookie}\n{header}\n<div class="layout">\n<main id="content">\n{article}\n</main>\n'
                f"{sidebar}\n</div>\n{footer}")
    elif site.layout == 1:  # blog: sidebar first, share and feedback under the post, banner last
        body = (f'{header}\n<div class="container">\n{sidebar}\n<main id="content">\n{article}\n'
                f"{_share_and_feedback(url, ui)}\n</main>\n</div>\n{footer}\n{cookie}")
    else:  # magazine: content in a wrapper div, feedback widget, banner just before the scripts
        body = (f'{header}\n<div id="page" class="wrapper">\n<div class="content-area" id="content">\n'
                f'{article}\n{_share_and_feedback(url, ui)}\n</div>\n{sidebar}\n</div>\n{footer}\n{cookie}')
    return f'<!DOCTYPE html>\n<html lang="{site.lang}">\n{head}\n<body>\n{body}\n{script}\n</body>\n</html>\n'
