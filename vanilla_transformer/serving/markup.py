"""The `format: "html"` of the translation server (LibreTranslate's API): translate the text between the tags of an HTML
fragment and keep the markup. `html_texts` parses the fragment, returns the texts to translate and a function that puts
their translations back and serializes the fragment again, with the translations escaped as text, never as markup.
lxml parses it: maintained, at C speed (libxml2), and it recovers broken markup as HTML5 parsers do (unclosed and
misnested tags, stray end tags) instead of failing on it. This module imports only lxml and the standard library.

What lxml (libxml2 2.14) normalises, so the output is equivalent HTML but not always the same bytes: attributes are
double-quoted (single-quoted when the value holds `"`), unquoted values are quoted, character references are decoded
(`&eacute;` comes back as `é`, `&nbsp;` as U+00A0) and only `&`, `<`, `>` (and `"` in attributes) re-escaped, boolean
attributes are minimised (`checked="checked"` gives `checked`), URL attributes (href, src, action, and name on <a>) are
percent-escaped (`a b/é` gives `a%20b/%C3%A9`), tag and attribute names are lowercased, missing end tags are added,
misnested tags repaired, stray end tags dropped, the tags <html>, <head>, <body> and <!DOCTYPE> in the fragment dropped
(with their attributes; a whole document comes back as its content), `<?...>` and `<![CDATA[...]]>` kept as comments
(`<!--?...?-->`, as HTML5 parses them), NUL as U+FFFD.
"""

import html
import re
from collections.abc import Callable

import lxml.html
from lxml import etree

__all__ = ["MAX_DEPTH", "MAX_TEXTS", "html_texts"]

MAX_DEPTH = 200  # elements nested in one another, as parsed; libxml2 itself stops nesting at 256 (254 in our wrapper)
MAX_TEXTS = 10_000  # texts to translate in one fragment

# Their content is never translated: code, and the elements HTML parses as raw text (lxml keeps the raw text of xmp,
# iframe, noembed, noframes and plaintext but serializes it escaped, so their content is not prose to translate).
UNTRANSLATED_TAGS = frozenset({"script", "style", "code", "pre", "xmp", "plaintext", "iframe", "noembed", "noframes"})

# What lxml refuses to put in a tree (XML's characters): such a fragment would parse, and fail when rebuilt.
_NOT_XML_CHARACTER = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# libxml2 stops parsing at </html> and drops what follows: a fragment with content after one is refused, not truncated
_HTML_END_TAG_THEN_CONTENT = re.compile(r"</html(?![^\s/>])[^>]*>\s*\S", re.IGNORECASE)


def _is_untranslated(element: etree._Element) -> bool:
    if element.tag in UNTRANSLATED_TAGS:
        return True
    if element.get("translate", "").lower() == "no":  # an enumerated attribute: ASCII case-insensitive
        return True
    return "notranslate" in element.get("class", "").split()


def html_texts(fragment: str) -> tuple[list[str], Callable[[list[str]], str]]:
    """The texts to translate in an HTML fragment, and the function that puts their translations back.

    The fragment is parsed as the content of a <body> (several top-level elements, leading and trailing text) and comes
    back without any <html>/<body> wrapper. The texts are each element's text and each tail that hold something other
    than whitespace (Python's `str.isspace`, so no-break spaces too), in document order, without their leading and
    trailing whitespace: `rebuild` puts that whitespace back around each translation (`<p> Hello </p>` gives
    `<p> Hallo </p>`). Not translated: the content of <script>, <style>, <code>, <pre> (and of the raw-text elements
    xmp, plaintext, iframe, noembed, noframes), of an element with translate="no" or class "notranslate" (a descendant's
    translate="yes" does not bring translation back), comments and processing instructions, attribute values; the
    tails of all of these are translated.

    `rebuild(translations)` takes exactly `len(texts)` strings (ValueError otherwise; also ValueError, from lxml, for a
    translation holding a control character) and returns the fragment serialized by `lxml.html.tostring(node,
    encoding="unicode", method="html")` node by node, the text escaped (`<` as `&lt;`). It may be called again: each
    call replaces the translations of the previous one. A fragment with no tags is one text; an empty one gives no
    text and a rebuild that returns it unchanged.

    What lxml normalises: the module's docstring.

    Raises ValueError, with a message naming the problem, for a fragment nested deeper than MAX_DEPTH elements, with
    more than MAX_TEXTS texts to translate, holding a character outside XML's (a control character other than tab,
    newline and carriage return, a lone surrogate, U+FFFE, U+FFFF), or with content after a </html> (libxml2 would drop
    it; an `</html>` inside a script or comment counts too): the server answers HTTP 400.
    """
    body = _parsed(fragment)

    found = _Texts()
    after_body = list(body.itersiblings())  # after a </body> in the fragment, libxml2 puts the rest beside <body>
    found.collect(body, "text")
    for child in body:
        found.walk(child, 1, True)
    found.collect(body, "tail")
    for sibling in after_body:
        found.walk(sibling, 1, True)
    texts, slots = found.texts, found.slots

    def rebuild(translations: list[str]) -> str:
        if len(translations) != len(slots):
            raise ValueError(f"{len(slots)} translations expected, {len(translations)} given")
        for (node, field, leading, trailing), translation in zip(slots, translations, strict=True):
            setattr(node, field, f"{leading}{translation}{trailing}")
        return _serialized(body, after_body)

    return texts, rebuild


class _Texts:
    """The texts to translate as a walk finds them, and where each goes back: (node, "text" or "tail", leading and
    trailing whitespace)."""

    def __init__(self):
        self.slots: list[tuple[etree._Element, str, str, str]] = []
        self.texts: list[str] = []

    def collect(self, node: etree._Element, field: str) -> None:
        value = getattr(node, field)
        if value is None or value.isspace():
            return
        if len(self.texts) == MAX_TEXTS:
            raise ValueError(f"the HTML has more than {MAX_TEXTS} texts to translate")
        start, end = len(value) - len(value.lstrip()), len(value.rstrip())
        self.slots.append((node, field, value[:start], value[end:]))
        self.texts.append(value[start:end])

    def walk(self, element: etree._Element, depth: int, translated: bool) -> None:
        if depth > MAX_DEPTH:
            raise ValueError(f"the HTML nests elements deeper than {MAX_DEPTH}")
        is_element = isinstance(element.tag, str)  # not a comment nor a processing instruction
        inner = translated and is_element and not _is_untranslated(element)
        if inner:
            self.collect(element, "text")
        for child in element:
            self.walk(child, depth + 1, inner)
        if translated:  # the tail belongs to the parent's content
            self.collect(element, "tail")


def _parsed(fragment: str) -> etree._Element:
    """The fragment parsed as a <body>'s content; ValueError for what lxml would refuse or drop."""
    bad = _NOT_XML_CHARACTER.search(fragment)
    if bad is not None:
        character = f"U+{ord(bad.group()):04X}"
        raise ValueError(
            f"the HTML holds {character} at {bad.start()}, a control character or non-character lxml refuses"
        )
    if _HTML_END_TAG_THEN_CONTENT.search(fragment) is not None:
        raise ValueError("the HTML has content after </html>, which the parser would drop")
    try:
        document = lxml.html.document_fromstring(f"<html><body>{fragment}</body></html>")
    except etree.LxmlError as error:
        raise ValueError(f"the HTML cannot be parsed: {error}") from error
    return document.find("body")


def _serialized(body: etree._Element, after_body: list[etree._Element]) -> str:
    """The fragment again: the body's text and children, and what libxml2 put after it, without a wrapper."""
    return "".join(
        [
            html.escape(body.text or "", quote=False),
            *(lxml.html.tostring(child, encoding="unicode", method="html") for child in body),
            html.escape(body.tail or "", quote=False),
            *(lxml.html.tostring(sibling, encoding="unicode", method="html") for sibling in after_body),
        ]
    )
