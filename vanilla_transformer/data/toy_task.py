"""The embedded synthetic task: an English-like source language and an invented German-like target language.

The target differs in two ways that a model must learn with attention rather than by copying word for word:
- word order: adjectives follow their noun and the verb goes to the end of its clause (subject object place verb);
- agreement: articles and adjective endings depend on the noun's gender and number, and the verb ending on the
  subject's number, which in the target is far from the verb.
"""

import random
from dataclasses import dataclass

from vanilla_transformer.data.readers import Pair

# English singular, English plural, target singular, target plural, target gender (masculine, feminine, neuter)
NOUNS = [
    ("dog", "dogs", "hunt", "hunte", "m"),
    ("cat", "cats", "katse", "katsen", "f"),
    ("horse", "horses", "perd", "perde", "n"),
    ("bird", "birds", "fogel", "fogels", "m"),
    ("frog", "frogs", "frosk", "froske", "m"),
    ("cow", "cows", "kuo", "kuoen", "f"),
    ("mouse", "mice", "mauso", "mausen", "f"),
    ("child", "children", "kint", "kinter", "n"),
    ("woman", "women", "frowe", "frowen", "f"),
    ("man", "men", "mann", "manner", "m"),
    ("teacher", "teachers", "lerar", "lerare", "m"),
    ("farmer", "farmers", "buar", "buaren", "m"),
    ("king", "kings", "kunig", "kunige", "m"),
    ("queen", "queens", "kunigin", "kuniginnen", "f"),
    ("doctor", "doctors", "arst", "arste", "m"),
    ("friend", "friends", "frunt", "frunte", "m"),
    ("house", "houses", "haus", "hauser", "n"),
    ("city", "cities", "stat", "stete", "f"),
    ("garden", "gardens", "gardo", "gardos", "m"),
    ("forest", "forests", "wolt", "welder", "m"),
    ("river", "rivers", "flus", "flusse", "m"),
    ("school", "schools", "skola", "skolen", "f"),
    ("market", "markets", "markat", "markate", "m"),
    ("station", "stations", "stazion", "stazionen", "f"),
    ("village", "villages", "dorp", "dorpe", "n"),
    ("bridge", "bridges", "brugge", "bruggen", "f"),
    ("mountain", "mountains", "berk", "berke", "m"),
    ("church", "churches", "kirka", "kirken", "f"),
    ("table", "tables", "tisk", "tiske", "m"),
    ("book", "books", "buk", "buker", "n"),
    ("apple", "apples", "apfal", "apfel", "m"),
    ("letter", "letters", "brif", "brife", "m"),
    ("car", "cars", "wagan", "wagans", "m"),
    ("boat", "boats", "bot", "bote", "n"),
    ("ball", "balls", "bal", "balle", "m"),
    ("flower", "flowers", "blum", "blumen", "f"),
    ("tree", "trees", "baum", "baume", "m"),
    ("key", "keys", "slussel", "slussels", "m"),
    ("bread", "breads", "brot", "brote", "n"),
    ("window", "windows", "fenstar", "fenstars", "n"),
]
# English adjective -> target stem; the target adds an ending for gender and number.
ADJECTIVES = {
    "red": "rod",
    "blue": "blaw",
    "green": "grun",
    "yellow": "gel",
    "black": "swart",
    "white": "wit",
    "brown": "brun",
    "grey": "gra",
    "old": "alt",
    "young": "jung",
    "big": "grot",
    "small": "klin",
    "new": "noi",
    "happy": "froh",
    "tired": "mud",
    "quiet": "stil",
    "fast": "snel",
    "beautiful": "skon",
    "cold": "kalt",
    "warm": "warm",
}
ADJECTIVE_ENDINGS = {"m": "er", "f": "e", "n": "es", "plural": "en"}
DEFINITE_ARTICLES = {"m": "ter", "f": "tie", "n": "tas", "plural": "tei"}
INDEFINITE_ARTICLES = {"m": "ain", "f": "aine", "n": "ains"}  # plural nouns have no indefinite article
# English verb (base form) -> target stem; the target adds "et" for a singular subject and "en" for a plural one.
TRANSITIVE_VERBS = {
    "see": "sih",
    "like": "mag",
    "find": "fint",
    "buy": "kof",
    "paint": "mal",
    "pull": "drag",
    "help": "helf",
    "visit": "bisuk",
    "follow": "folg",
    "read": "les",
    "build": "bau",
    "open": "opan",
}
INTRANSITIVE_VERBS = {"sleep": "slaf", "run": "lop", "sing": "sing", "wait": "wart", "laugh": "lach", "dance": "tans"}
VERB_ENDINGS = {"singular": "et", "plural": "en"}
NUMBERS = {
    "two": "tvo",
    "three": "dri",
    "four": "fir",
    "five": "fimf",
    "six": "seks",
    "seven": "siben",
    "eight": "aht",
    "nine": "nin",
    "ten": "tsen",
    "eleven": "elf",
    "twelve": "tvolf",
}
PREPOSITIONS = {"in": "ine", "near": "naha", "behind": "hintar", "with": "mitte", "under": "untar", "on": "oba"}
CONJUNCTIONS = {"and": "unt", "but": "abar", "because": "wil", "while": "wehrent"}

_NOUNS_BY_ENGLISH = {noun[0]: noun for noun in NOUNS}


@dataclass
class _NounPhrase:
    noun: str  # English singular, a key of `_NOUNS_BY_ENGLISH`
    plural: bool = False
    definite: bool = True
    number: str | None = None  # English number word, plural only
    adjectives: tuple[str, ...] = ()

    def source(self) -> list[str]:
        _, english_plural, *_ = _NOUNS_BY_ENGLISH[self.noun]
        article = ["the"] if self.definite else ([] if self.plural else ["a"])
        number = [self.number] if self.number else []
        return article + number + list(self.adjectives) + [english_plural if self.plural else self.noun]

    def target(self) -> list[str]:
        _, _, singular, plural, gender = _NOUNS_BY_ENGLISH[self.noun]
        form = "plural" if self.plural else gender
        if self.definite:
            article = [DEFINITE_ARTICLES[form]]
        else:
            article = [] if self.plural else [INDEFINITE_ARTICLES[form]]
        number = [NUMBERS[self.number]] if self.number else []
        adjectives = [ADJECTIVES[adjective] + ADJECTIVE_ENDINGS[form] for adjective in self.adjectives]
        return article + number + [plural if self.plural else singular] + adjectives


@dataclass
class _Clause:
    subject: _NounPhrase
    verb: str  # English base form
    object: _NounPhrase | None = None  # only for transitive verbs
    place: tuple[str, _NounPhrase] | None = None  # (English preposition, noun phrase)

    def source(self) -> list[str]:
        verb = self.verb if self.subject.plural else self.verb + "s"
        words = self.subject.source() + [verb]
        if self.object:
            words += self.object.source()
        if self.place:
            words += [self.place[0]] + self.place[1].source()
        return words

    def target(self) -> list[str]:
        words = self.subject.target()
        if self.object:
            words += self.object.target()
        if self.place:
            words += [PREPOSITIONS[self.place[0]]] + self.place[1].target()
        stem = TRANSITIVE_VERBS.get(self.verb) or INTRANSITIVE_VERBS[self.verb]
        return words + [stem + VERB_ENDINGS["plural" if self.subject.plural else "singular"]]


def _example_pair() -> Pair:
    subject = _NounPhrase("dog", adjectives=("small",))
    clause = _Clause(subject, "see", _NounPhrase("cat", definite=False, adjectives=("red",)))
    return " ".join(clause.source()), " ".join(clause.target())


# A sentence of the task and its translation, from its own vocabulary (the model card's example): other words, an
# English sentence say, are not in the task and come out as noise.
SYNTHETIC_EXAMPLE = _example_pair()
# The task's two languages in words: neither is a natural language, so a model card names no language code for them.
SYNTHETIC_LANGUAGES = ("the task's English-like source language", "its invented German-like target language")


def _random_noun_phrase(rng: random.Random) -> _NounPhrase:
    plural = rng.random() < 0.4
    definite = rng.random() < 0.6
    number = rng.choice(list(NUMBERS)) if plural and rng.random() < 0.5 else None
    adjective_count = rng.choices([0, 1, 2], weights=[5, 4, 1])[0]
    adjectives = tuple(rng.sample(list(ADJECTIVES), adjective_count))
    return _NounPhrase(rng.choice(NOUNS)[0], plural, definite, number, adjectives)


def _random_clause(rng: random.Random) -> _Clause:
    transitive = rng.random() < 0.65
    verb = rng.choice(list(TRANSITIVE_VERBS if transitive else INTRANSITIVE_VERBS))
    noun_object = _random_noun_phrase(rng) if transitive else None
    place = (rng.choice(list(PREPOSITIONS)), _random_noun_phrase(rng)) if rng.random() < 0.4 else None
    return _Clause(_random_noun_phrase(rng), verb, noun_object, place)


def _random_sentence(rng: random.Random, min_words: int = 3, max_words: int = 20) -> Pair:
    while True:
        clauses = [_random_clause(rng)]
        conjunctions = []
        if rng.random() < 0.3:
            conjunctions.append(rng.choice(list(CONJUNCTIONS)))
            clauses.append(_random_clause(rng))
        source, target = clauses[0].source(), clauses[0].target()
        for conjunction, clause in zip(conjunctions, clauses[1:], strict=True):
            source += [conjunction] + clause.source()
            target += [CONJUNCTIONS[conjunction]] + clause.target()
        if min_words <= len(source) <= max_words:
            return " ".join(source), " ".join(target)


def synthetic_translation_pairs(num_pairs: int, seed: int = 0) -> list[Pair]:
    """Generate `num_pairs` (source, target) sentence pairs of the built-in synthetic task (3 to 20 words each).

    The same seed always gives the same pairs, so training runs offline and reproducibly without any data.
    """
    rng = random.Random(seed)
    return [_random_sentence(rng) for _ in range(num_pairs)]
