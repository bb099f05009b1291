"""The embedded synthetic task: deterministic, varied, and a translation that needs attention (order and agreement)."""

from vanilla_transformer.data.toy_task import (
    ADJECTIVES,
    INTRANSITIVE_VERBS,
    NOUNS,
    TRANSITIVE_VERBS,
    _Clause,
    _NounPhrase,
    synthetic_translation_pairs,
)


def test_synthetic_pairs_are_deterministic_per_seed():
    first = synthetic_translation_pairs(200, seed=0)
    assert synthetic_translation_pairs(200, seed=0) == first
    assert synthetic_translation_pairs(200, seed=1) != first
    assert len(first) == 200
    assert all(isinstance(source, str) and isinstance(target, str) for source, target in first)


def test_synthetic_sentence_lengths_vary_between_3_and_20_words():
    lengths = {len(source.split()) for source, _ in synthetic_translation_pairs(2000)}
    assert min(lengths) == 3
    assert max(lengths) == 20
    assert len(lengths) == 18


def test_synthetic_target_is_not_a_copy():
    pairs = synthetic_translation_pairs(500)
    source_words = {word for source, _ in pairs for word in source.split()}
    target_words = {word for _, target in pairs for word in target.split()}
    assert not source_words & target_words
    # A transitive clause ends with its object in the source but with the verb in the target.
    target_verb_endings = ("et", "en")
    verb_final = [target.split()[-1].endswith(target_verb_endings) for _, target in pairs]
    assert all(verb_final)
    source_last_is_verb = [source.split()[-1].removesuffix("s") in TRANSITIVE_VERBS for source, _ in pairs]
    assert sum(source_last_is_verb) < len(pairs) / 2


def test_synthetic_grammar_reorders_and_agrees():
    clause = _Clause(
        subject=_NounPhrase("dog", adjectives=("red",)),
        verb="see",
        object=_NounPhrase("cat", definite=False, adjectives=("small",)),
        place=("in", _NounPhrase("house", adjectives=("old",))),
    )
    assert " ".join(clause.source()) == "the red dog sees a small cat in the old house"
    assert " ".join(clause.target()) == "ter hunt roder aine katse kline ine tas haus altes sihet"

    plural = _Clause(subject=_NounPhrase("child", plural=True, number="three", adjectives=("happy",)), verb="sleep")
    assert " ".join(plural.source()) == "the three happy children sleep"
    assert " ".join(plural.target()) == "tei dri kinter frohen slafen"


def test_synthetic_lexicon_is_consistent():
    assert 100 <= len(NOUNS) + len(ADJECTIVES) + len(TRANSITIVE_VERBS) + len(INTRANSITIVE_VERBS) + 40 <= 200
    english = [noun[0] for noun in NOUNS]
    assert len(set(english)) == len(english)
    assert {noun[4] for noun in NOUNS} == {"m", "f", "n"}
