"""`format: "html"` of the translation server: vanilla_transformer/serving/markup.py, with a fake translation."""

import pytest

from vanilla_transformer.serving.markup import MAX_DEPTH, MAX_TEXTS, html_texts


def translate(fragment: str, translation=str.upper) -> str:
    texts, rebuild = html_texts(fragment)
    return rebuild([translation(text) for text in texts])


def test_tags_and_attributes_are_kept_and_only_text_is_translated():
    fragment = (
        '<p class="intro lead" data-id="42" id="x">Read <a href="/docs?page=1&amp;lang=en" title="Tom &amp; Jerry">'
        "the docs</a> now</p>"
    )
    assert translate(fragment) == (
        '<p class="intro lead" data-id="42" id="x">READ <a href="/docs?page=1&amp;lang=en" title="Tom &amp; Jerry">'
        "THE DOCS</a> NOW</p>"
    )


def test_texts_and_tails_come_in_document_order():
    texts, _ = html_texts("first<p>second<br>third</p>fourth<div><span>fifth</span>sixth</div>seventh")
    assert texts == ["first", "second", "third", "fourth", "fifth", "sixth", "seventh"]


def test_nested_inline_tags_give_one_text_each():
    texts, rebuild = html_texts("<p>Hello <b>big</b> world</p>")
    assert texts == ["Hello", "big", "world"]
    assert rebuild(["Hallo", "große", "Welt"]) == "<p>Hallo <b>große</b> Welt</p>"


def test_whitespace_around_each_text_stays_out_of_it_and_is_put_back():
    texts, rebuild = html_texts("  <p> Hello </p>\n<p>\tworld\n</p>  ")
    assert texts == ["Hello", "world"]
    assert rebuild(["Hallo", "Welt"]) == "  <p> Hallo </p>\n<p>\tWelt\n</p>  "


@pytest.mark.parametrize(
    "untranslated",
    [
        "<script>if (a < b) alert('hi');</script>",
        "<style>p > a { color: red }</style>",
        "<code>print(<i>value</i>)</code>",
        "<pre>  keep\n  this</pre>",
        '<span translate="no">Vanilla <b>Transformer</b></span>',
        '<span class="brand notranslate">Vanilla <b>Transformer</b></span>',
    ],
)
def test_code_and_marked_content_is_untouched_and_its_tail_translated(untranslated):
    texts, rebuild = html_texts(f"<div>before {untranslated} after</div>")  # <pre> would end a <p>
    assert texts == ["before", "after"]
    assert rebuild(["BEFORE", "AFTER"]) == f"<div>BEFORE {untranslated} AFTER</div>"


def test_a_comment_is_kept_untranslated_and_its_tail_translated():
    assert translate("<p>one<!-- keep me -->two</p>") == "<p>ONE<!-- keep me -->TWO</p>"


def test_markup_in_a_translation_is_escaped_as_text():
    assert translate("<p>x</p>y", lambda text: "<b>bold</b> & co") == (
        "<p>&lt;b&gt;bold&lt;/b&gt; &amp; co</p>&lt;b&gt;bold&lt;/b&gt; &amp; co"
    )


def test_markup_in_the_translation_of_leading_text_is_escaped_as_text():
    assert translate("x<p>y</p>", lambda text: "<b>") == "&lt;b&gt;<p>&lt;b&gt;</p>"


def test_plain_text_without_tags_is_one_text():
    texts, rebuild = html_texts("  Hello world  ")
    assert texts == ["Hello world"]
    assert rebuild(["Hallo Welt"]) == "  Hallo Welt  "


def test_an_empty_fragment_has_no_text_and_comes_back_unchanged():
    texts, rebuild = html_texts("")
    assert texts == []
    assert rebuild([]) == ""


def test_a_fragment_of_whitespace_has_no_text_and_comes_back_unchanged():
    texts, rebuild = html_texts(" \n ")
    assert texts == []
    assert rebuild([]) == " \n "


def test_the_output_has_no_html_or_body_wrapper():
    assert translate("<p>a</p><p>b</p>") == "<p>A</p><p>B</p>"


@pytest.mark.parametrize("count", [0, 2])
def test_a_wrong_number_of_translations_is_a_value_error(count):
    _, rebuild = html_texts("<p>one</p>")
    with pytest.raises(ValueError, match="1 translations expected"):
        rebuild(["x"] * count)


def test_a_wrong_number_of_translations_for_an_empty_fragment_is_a_value_error():
    _, rebuild = html_texts("")
    with pytest.raises(ValueError, match="0 translations expected"):
        rebuild(["x"])


def test_nesting_deeper_than_the_bound_is_refused():
    html_texts("<span>" * MAX_DEPTH + "x" + "</span>" * MAX_DEPTH)
    with pytest.raises(ValueError, match="deeper than 200"):
        html_texts("<span>" * (MAX_DEPTH + 1) + "x" + "</span>" * (MAX_DEPTH + 1))


def test_nesting_deeper_than_the_bound_is_refused_in_untranslated_content_too():
    with pytest.raises(ValueError, match="deeper than 200"):
        html_texts("<code>" + "<span>" * MAX_DEPTH + "x" + "</span>" * MAX_DEPTH + "</code>")


def test_more_texts_than_the_bound_are_refused():
    texts, _ = html_texts("<b>x</b>" * MAX_TEXTS)
    assert len(texts) == MAX_TEXTS
    with pytest.raises(ValueError, match="more than 10000 texts"):
        html_texts("<b>x</b>" * MAX_TEXTS + "y")


def test_a_control_character_is_refused_before_parsing():
    with pytest.raises(ValueError, match=r"U\+000B"):
        html_texts("<p>\x0bHello</p>")


def test_content_after_a_closing_body_tag_is_kept_and_translated():
    assert translate("<p>a</p></body>b<i>c</i>") == "<p>A</p>B<i>C</i>"


def test_a_whole_document_comes_back_as_its_translated_content():
    assert translate('<!DOCTYPE html><html lang="en"><body><p>hi</p></body></html>\n') == "<p>HI</p>\n"


def test_content_after_a_closing_html_tag_is_refused_rather_than_dropped():
    with pytest.raises(ValueError, match="after </html>"):
        html_texts("<p>a</p></HTML >b")
