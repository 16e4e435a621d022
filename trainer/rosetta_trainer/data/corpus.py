"""The built-in demo corpora: English sentences about quantities, prices, ages, dates and years,
with faithful translations into German, Spanish and French; and short English news items with
their summaries (generate_articles, for `task: summarization`).

It exists so that a training run works with no downloads: the vocabulary is small (a few
hundred words), yet the number words alone (0-9999, German compounds such as
"dreihunderteinundzwanzig", French "quatre-vingt-dix-sept", Spanish gender agreement such as
"veintiuna manzanas") make it a translation task rather than a lookup table, and a tiny
transformer learns it in minutes on a CPU.

    >>> generate_pairs("de", 2, seed=0)  # doctest: +SKIP
    [('We need nine thousand and forty blue birds.', 'Wir brauchen neuntausendvierzig blaue Vögel.'), ...]

Determinism and disjoint splits: every sentence is a tuple of choices (template, number,
noun, adjective, ...). A stable hash of that tuple puts it in one of `PARTITIONS` buckets, and
seed `s` only keeps sentences from bucket `s % PARTITIONS`. So seeds 0, 1 and 2 (train,
validation, test) share no sentence at all, while seeds in the same bucket (0 and 16) overlap
only by chance. The English side depends on the seed only, never on the target language, so
one seed gives the same English sentences in every language. Within one seed, sentences from
the small templates (dates) can repeat; nothing is deduplicated.

Pure Python, no torch: the data module and the docs use it.
"""

from __future__ import annotations

import gzip
import hashlib
import random
from pathlib import Path
from typing import Callable

from rosetta_trainer.data.number_words import (
    de_cardinal,
    de_ordinal_dative,
    de_year,
    en_cardinal,
    en_ordinal,
    en_year,
    es_cardinal,
    es_day,
    fr_cardinal,
    fr_day,
    number_words,
)

SUPPORTED_LANGS = ("de", "es", "fr")
SOURCE_LANG = "en"
# Seeds give disjoint sentence sets when they differ modulo this number.
PARTITIONS = 16

# -------------------------------------------------------------------- vocabulary

# English plural, German plural, Spanish plural and gender, French plural and gender.
_NOUNS = [
    ("apples", "Äpfel", "manzanas", "f", "pommes", "f"),
    ("books", "Bücher", "libros", "m", "livres", "m"),
    ("chairs", "Stühle", "sillas", "f", "chaises", "f"),
    ("bottles", "Flaschen", "botellas", "f", "bouteilles", "f"),
    ("cars", "Autos", "coches", "m", "voitures", "f"),
    ("birds", "Vögel", "pájaros", "m", "oiseaux", "m"),
    ("cups", "Tassen", "tazas", "f", "tasses", "f"),
    ("flowers", "Blumen", "flores", "f", "fleurs", "f"),
    ("houses", "Häuser", "casas", "f", "maisons", "f"),
    ("keys", "Schlüssel", "llaves", "f", "clés", "f"),
    ("pencils", "Bleistifte", "lápices", "m", "crayons", "m"),
    ("dogs", "Hunde", "perros", "m", "chiens", "m"),
    ("cats", "Katzen", "gatos", "m", "chats", "m"),
    ("trees", "Bäume", "árboles", "m", "arbres", "m"),
    ("shirts", "Hemden", "camisas", "f", "chemises", "f"),
]

# Nouns that only take some adjectives, so that no one counts "blue dogs" (indices into _ADJECTIVES).
_NOUN_ADJECTIVES = {"dogs": (4, 5, 6, 7), "cats": (4, 5, 6, 7), "trees": (2, 6, 7)}

# English; German plural after a bare number (strong declension, nominative = accusative);
# Spanish masculine/feminine plural; French masculine/feminine plural and whether the French
# adjective goes before the noun ("trois petits chats") or after it ("trois chats noirs").
_ADJECTIVES = [
    ("red", "rote", ("rojos", "rojas"), ("rouges", "rouges"), False),
    ("blue", "blaue", ("azules", "azules"), ("bleus", "bleues"), False),
    ("green", "grüne", ("verdes", "verdes"), ("verts", "vertes"), False),
    ("yellow", "gelbe", ("amarillos", "amarillas"), ("jaunes", "jaunes"), False),
    ("black", "schwarze", ("negros", "negras"), ("noirs", "noires"), False),
    ("white", "weiße", ("blancos", "blancas"), ("blancs", "blanches"), False),
    ("small", "kleine", ("pequeños", "pequeñas"), ("petits", "petites"), True),
    ("big", "große", ("grandes", "grandes"), ("grands", "grandes"), True),
]

# {q} is the quantity phrase ("three red apples").
_COUNT_TEMPLATES = [
    ("I bought {q}.", "Ich habe {q} gekauft.", "Compré {q}.", "J'ai acheté {q}."),
    ("We need {q}.", "Wir brauchen {q}.", "Necesitamos {q}.", "Nous avons besoin de {q}."),
    ("There are {q} here.", "Hier gibt es {q}.", "Aquí hay {q}.", "Il y a {q} ici."),
    ("She sold {q} yesterday.", "Sie hat gestern {q} verkauft.", "Ayer vendió {q}.", "Elle a vendu {q} hier."),
    ("They counted {q}.", "Sie haben {q} gezählt.", "Contaron {q}.", "Ils ont compté {q}."),
    ("I see {q}.", "Ich sehe {q}.", "Veo {q}.", "Je vois {q}."),
]

# Prices: euros are masculine in Spanish and French; German "Euro" has no plural after numbers.
_PRICE_SUBJECTS = [
    ("The ticket", "Die Fahrkarte", "El billete", "Le billet"),
    ("The bicycle", "Das Fahrrad", "La bicicleta", "Le vélo"),
    ("The table", "Der Tisch", "La mesa", "La table"),
    ("The coat", "Der Mantel", "El abrigo", "Le manteau"),
]

# Ages are "is ... years old", "ist ... Jahre alt", "tiene ... años", "a ... ans"; the last two
# numbers bound a plausible age for the person.
_PEOPLE = [
    ("My brother", "Mein Bruder", "Mi hermano", "Mon frère", 2, 60),
    ("My sister", "Meine Schwester", "Mi hermana", "Ma sœur", 2, 60),
    ("My father", "Mein Vater", "Mi padre", "Mon père", 25, 90),
    ("My mother", "Meine Mutter", "Mi madre", "Ma mère", 25, 90),
    ("My grandfather", "Mein Großvater", "Mi abuelo", "Mon grand-père", 50, 99),
    ("My grandmother", "Meine Großmutter", "Mi abuela", "Ma grand-mère", 50, 99),
]

_ANSWER_TEMPLATES = [
    ("The answer is {n}.", "Die Antwort ist {n}.", "La respuesta es {n}.", "La réponse est {n}."),
    ("The result is {n}.", "Das Ergebnis ist {n}.", "El resultado es {n}.", "Le résultat est {n}."),
]

# Event, then the verb phrase that introduces a date.
_EVENTS = [
    ("The meeting is", "Das Treffen ist", "La reunión es", "La réunion a lieu"),
    ("My birthday is", "Mein Geburtstag ist", "Mi cumpleaños es", "Mon anniversaire est"),
    ("The concert is", "Das Konzert ist", "El concierto es", "Le concert a lieu"),
    ("The exam is", "Die Prüfung ist", "El examen es", "L'examen a lieu"),
    ("The party is", "Die Feier ist", "La fiesta es", "La fête a lieu"),
]

_MONTHS = [
    ("January", "Januar", "enero", "janvier", 31), ("February", "Februar", "febrero", "février", 29),
    ("March", "März", "marzo", "mars", 31), ("April", "April", "abril", "avril", 30),
    ("May", "Mai", "mayo", "mai", 31), ("June", "Juni", "junio", "juin", 30),
    ("July", "Juli", "julio", "juillet", 31), ("August", "August", "agosto", "août", 31),
    ("September", "September", "septiembre", "septembre", 30),
    ("October", "Oktober", "octubre", "octobre", 31),
    ("November", "November", "noviembre", "novembre", 30),
    ("December", "Dezember", "diciembre", "décembre", 31),
]

_WEEKDAYS = [
    ("Monday", "Montag", "lunes", "lundi"), ("Tuesday", "Dienstag", "martes", "mardi"),
    ("Wednesday", "Mittwoch", "miércoles", "mercredi"), ("Thursday", "Donnerstag", "jueves", "jeudi"),
    ("Friday", "Freitag", "viernes", "vendredi"), ("Saturday", "Samstag", "sábado", "samedi"),
    ("Sunday", "Sonntag", "domingo", "dimanche"),
]

_YEAR_TEMPLATES = [
    ("She was born in {y}.", "Sie wurde {y} geboren.", "Nació en {y}.", "Elle est née en {y}."),
    ("He was born in {y}.", "Er wurde {y} geboren.", "Nació en {y}.", "Il est né en {y}."),
    ("The bridge was built in {y}.", "Die Brücke wurde {y} gebaut.", "El puente fue construido en {y}.",
     "Le pont a été construit en {y}."),
    ("The house was built in {y}.", "Das Haus wurde {y} gebaut.", "La casa fue construida en {y}.",
     "La maison a été construite en {y}."),
]

_LANG_INDEX = {"en": 0, "de": 1, "es": 2, "fr": 3}

# Sentence kinds and how often they are drawn: mostly counted nouns, where the numbers are.
_COUNT, _PRICE, _AGE, _ANSWER, _DATE, _YEAR = range(6)
_KIND_WEIGHTS = [(_COUNT, 55), (_PRICE, 8), (_AGE, 7), (_ANSWER, 8), (_DATE, 12), (_YEAR, 10)]
_KIND_TABLE = [kind for kind, weight in _KIND_WEIGHTS for _ in range(weight)]


# ---------------------------------------------------------------------- sampling


def _any_number(rng: random.Random) -> int:
    # Uniform over the digit count first: uniform over 0-9999 would be 90% four-digit numbers.
    digits = rng.randrange(4)
    return rng.randrange(10**digits if digits else 0, 10 ** (digits + 1))


def _countable(rng: random.Random) -> int:
    # Counts of 1 need singular nouns, and counts ending in 01 ("hundertein"/"hundertundein
    # Äpfel") have no settled German form: neither is ever drawn before a noun.
    while True:
        n = _any_number(rng)
        if n >= 2 and n % 100 != 1:
            return n


def _draw(rng: random.Random) -> tuple[int, ...]:
    """One sentence as a tuple of choices; its first element is the kind."""
    kind = rng.choice(_KIND_TABLE)
    if kind == _COUNT:
        noun = rng.randrange(len(_NOUNS))
        # Adjective index len(_ADJECTIVES) means "no adjective".
        allowed = _NOUN_ADJECTIVES.get(_NOUNS[noun][0], range(len(_ADJECTIVES)))
        adjective = rng.choice([*allowed, len(_ADJECTIVES)])
        return kind, rng.randrange(len(_COUNT_TEMPLATES)), _countable(rng), adjective, noun
    if kind == _PRICE:
        return kind, rng.randrange(len(_PRICE_SUBJECTS)), _countable(rng)
    if kind == _AGE:
        person = rng.randrange(len(_PEOPLE))
        low, high = _PEOPLE[person][4:]
        return kind, person, rng.randint(low, high)
    if kind == _ANSWER:
        return kind, rng.randrange(len(_ANSWER_TEMPLATES)), _any_number(rng)
    if kind == _DATE:
        month = rng.randrange(12)
        # Weekday index 7 means "no weekday".
        return kind, rng.randrange(len(_EVENTS)), rng.randrange(8), month, rng.randrange(1, _MONTHS[month][4] + 1)
    return kind, rng.randrange(len(_YEAR_TEMPLATES)), rng.randrange(1100, 2100)


def _partition(choice: tuple[int, ...]) -> int:
    # blake2b, not hash(): the split of a sentence must not change with the Python version.
    digest = hashlib.blake2b(repr(choice).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % PARTITIONS


def _quantity(lang: str, n: int, adjective: int, noun: int) -> str:
    en, de, es, es_gender, fr, fr_gender = _NOUNS[noun]
    adj = _ADJECTIVES[adjective] if adjective < len(_ADJECTIVES) else None
    if lang == "en":
        return " ".join([en_cardinal(n)] + ([adj[0]] if adj else []) + [en])
    if lang == "de":
        return " ".join([de_cardinal(n)] + ([adj[1]] if adj else []) + [de])
    if lang == "es":
        words = [es_cardinal(n, es_gender), es]
        if adj:
            words.append(adj[2][es_gender == "f"])
        return " ".join(words)
    words = [fr_cardinal(n, fr_gender == "f"), fr]
    if adj:
        form = adj[3][fr_gender == "f"]
        words.insert(1 if adj[4] else 2, form)
    return " ".join(words)


def _render(choice: tuple[int, ...], lang: str) -> str:
    i = _LANG_INDEX[lang]
    kind = choice[0]
    if kind == _COUNT:
        _, template, n, adjective, noun = choice
        return _COUNT_TEMPLATES[template][i].format(q=_quantity(lang, n, adjective, noun))
    if kind == _PRICE:
        _, subject, n = choice
        name = _PRICE_SUBJECTS[subject][i]
        return {
            "en": f"{name} costs {en_cardinal(n)} euros.",
            "de": f"{name} kostet {de_cardinal(n)} Euro.",
            "es": f"{name} cuesta {es_cardinal(n, 'm')} euros.",
            "fr": f"{name} coûte {fr_cardinal(n)} euros.",
        }[lang]
    if kind == _AGE:
        _, person, n = choice
        who = _PEOPLE[person][i]
        return {
            "en": f"{who} is {en_cardinal(n)} years old.",
            "de": f"{who} ist {de_cardinal(n)} Jahre alt.",
            "es": f"{who} tiene {es_cardinal(n, 'm')} años.",
            "fr": f"{who} a {fr_cardinal(n)} ans.",
        }[lang]
    if kind == _ANSWER:
        _, template, n = choice
        return _ANSWER_TEMPLATES[template][i].format(n=number_words(n, lang))
    if kind == _DATE:
        _, event, weekday, month, day = choice
        what, names = _EVENTS[event][i], _MONTHS[month]
        wd = _WEEKDAYS[weekday][i] if weekday < len(_WEEKDAYS) else None
        if lang == "en":
            return f"{what} on {wd + ', ' if wd else ''}the {en_ordinal(day)} of {names[0]}."
        if lang == "de":
            date = f"{de_ordinal_dative(day)} {names[1]}"
            return f"{what} am {wd}, dem {date}." if wd else f"{what} am {date}."
        if lang == "es":
            return f"{what} el {wd + ' ' if wd else ''}{es_day(day)} de {names[2]}."
        return f"{what} le {wd + ' ' if wd else ''}{fr_day(day)} {names[3]}."
    _, template, year = choice
    year_words: dict[str, Callable[[int], str]] = {"en": en_year, "de": de_year, "es": es_cardinal, "fr": fr_cardinal}
    words = year_words[lang](year)
    return _YEAR_TEMPLATES[template][i].format(y=words)


def generate_pairs(target_lang: str, size: int, seed: int) -> list[tuple[str, str]]:
    """`size` (English, translation) pairs; the same (size, seed) always gives the same list.

    Seeds that differ modulo `PARTITIONS` give disjoint sentence sets (see the module docstring).
    """
    if target_lang not in SUPPORTED_LANGS:
        raise ValueError(
            f"the generated corpus has no '{target_lang}'; supported: {', '.join(SUPPORTED_LANGS)}"
        )
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    rng = random.Random(seed)
    bucket = seed % PARTITIONS
    pairs: list[tuple[str, str]] = []
    while len(pairs) < size:
        choice = _draw(rng)
        if _partition(choice) == bucket:
            pairs.append((_render(choice, "en"), _render(choice, target_lang)))
    return pairs


# ----------------------------------------------------------------- summarization

# The summarization demo: short English news items whose reference summary is a deterministic
# condensation. One lead sentence holds the story ("On Monday, the farmers of Lyon sold three
# hundred and twelve red apples."), an optional next one compares it with last year, and the rest
# is noise: weather, a quote, and sentences of the translation corpus above, which carry
# quantities too, so copying the first number in sight is wrong. The summary keeps the story and
# drops the noise: "Lyon farmers sold three hundred and twelve red apples on Monday, more than
# last year." A tiny T5 learns it on a CPU in minutes. Splits are disjoint in the story (the
# summary), not just in the noise, by the same partitioning as the translation corpus.

_TOWNS = ["Lyon", "Porto", "Bergen", "Graz", "Turin", "Leeds", "Bruges", "Ghent", "Basel", "Cork",
          "Split", "Krakow"]
_GROUPS = ["farmers", "bakers", "students", "fishermen", "volunteers", "shopkeepers", "gardeners",
           "children"]
_VERBS = ["sold", "counted", "collected", "bought", "found", "painted"]
_COMPARISONS = [None, "more", "fewer"]
_WEATHER = ["It was a sunny morning.", "It rained all day.", "The wind was cold.",
            "It was a warm evening.", "Snow fell in the night."]
_QUOTES = ["\"It was a good day,\" said the mayor.", "\"We are very happy,\" said one of them.",
           "\"Come back next week,\" said a neighbour.", "\"Nobody expected it,\" said the teacher."]


def _draw_story(rng: random.Random) -> tuple[int, ...]:
    noun = rng.randrange(len(_NOUNS))
    allowed = _NOUN_ADJECTIVES.get(_NOUNS[noun][0], range(len(_ADJECTIVES)))
    adjective = rng.choice([*allowed, len(_ADJECTIVES)])
    return (rng.randrange(len(_TOWNS)), rng.randrange(len(_GROUPS)), rng.randrange(len(_VERBS)),
            _countable(rng), adjective, noun, rng.randrange(len(_WEEKDAYS)), rng.randrange(len(_COMPARISONS)))


def _article(story: tuple[int, ...], rng: random.Random) -> tuple[str, str]:
    town, group, verb, n, adjective, noun, weekday, comparison = story
    what = f"{_VERBS[verb]} {_quantity('en', n, adjective, noun)}"
    day, more = _WEEKDAYS[weekday][0], _COMPARISONS[comparison]
    lead = [f"On {day}, the {_GROUPS[group]} of {_TOWNS[town]} {what}."]
    if more:
        lead.append(f"That is {more} than last year.")
    noise = [rng.choice(_WEATHER), rng.choice(_QUOTES)] + [_render(_draw(rng), "en") for _ in range(rng.randint(1, 2))]
    rng.shuffle(noise)
    # The story is first or second: a summarizer has to find it, not just copy the opening.
    at = rng.randint(0, 1)
    sentences = noise[:at] + lead + noise[at:]
    summary = f"{_TOWNS[town]} {_GROUPS[group]} {what} on {day}{f', {more} than last year' if more else ''}."
    return " ".join(sentences), summary


def generate_articles(size: int, seed: int) -> list[tuple[str, str]]:
    """`size` (article, summary) pairs in English; the same (size, seed) always gives the same list.

    Seeds that differ modulo `PARTITIONS` share no summary (see the module docstring).
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    rng = random.Random(seed)
    bucket = seed % PARTITIONS
    out: list[tuple[str, str]] = []
    while len(out) < size:
        story = _draw_story(rng)
        if _partition(story) == bucket:
            out.append(_article(story, rng))
    return out


def write_pairs(
    dir: str | Path,
    source_lang: str,
    target_lang: str,
    splits: dict[str, tuple[int, int]] | None = None,
    gzip_files: bool = False,
) -> dict[str, tuple[Path, Path]]:
    """Write line-aligned `{split}.{lang}` files (`.gz` with gzip_files) for the `pairs` format.

    `splits` maps a split name to (size, seed); the default gives train/validation/test from
    seeds 0/1/2, which share no sentence. Returns {split: (source_path, target_path)}.
    """
    if source_lang != SOURCE_LANG:
        raise ValueError(f"the generated corpus is translated from '{SOURCE_LANG}', not '{source_lang}'")
    if splits is None:
        splits = {"train": (20000, 0), "validation": (500, 1), "test": (500, 2)}
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ".gz" if gzip_files else ""
    written = {}
    for split, (size, seed) in splits.items():
        pairs = generate_pairs(target_lang, size, seed)
        paths = (out / f"{split}.{source_lang}{suffix}", out / f"{split}.{target_lang}{suffix}")
        for side, path in enumerate(paths):
            text = "".join(pair[side] + "\n" for pair in pairs)
            if gzip_files:
                # mtime=0 keeps the bytes identical from run to run.
                with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
                    f.write(text.encode("utf-8"))
            else:
                path.write_text(text, encoding="utf-8")
        written[split] = paths
    return written
