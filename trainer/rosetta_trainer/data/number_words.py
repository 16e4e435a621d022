"""Numbers in words, in English, German, Spanish and French: cardinals (with Spanish and French
gender agreement), ordinals, days of the month and years, as the demo corpus (corpus.py) writes
them. 0-9999.
"""

from __future__ import annotations

# ------------------------------------------------------------------------ English

_EN_UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
             "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
             "seventeen", "eighteen", "nineteen"]
_EN_TENS = {2: "twenty", 3: "thirty", 4: "forty", 5: "fifty", 6: "sixty", 7: "seventy",
            8: "eighty", 9: "ninety"}
_EN_ORDINALS = ["", "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
                "ninth", "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth",
                "sixteenth", "seventeenth", "eighteenth", "nineteenth"]


def _en_below_100(n: int) -> str:
    if n < 20:
        return _EN_UNITS[n]
    tens, unit = divmod(n, 10)
    return _EN_TENS[tens] + (f"-{_EN_UNITS[unit]}" if unit else "")


def en_cardinal(n: int) -> str:
    # British style: "and" before the last two digits when a bigger part precedes them.
    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    hundreds, below = divmod(rest, 100)
    parts = []
    if thousands:
        parts.append(f"{_EN_UNITS[thousands]} thousand")
    if hundreds:
        parts.append(f"{_EN_UNITS[hundreds]} hundred")
    if below:
        if parts:
            parts.append("and")
        parts.append(_en_below_100(below))
    return " ".join(parts)


def en_ordinal(n: int) -> str:
    if n < 20:
        return _EN_ORDINALS[n]
    tens, unit = divmod(n, 10)
    if unit == 0:
        return _EN_TENS[tens][:-1] + "ieth"
    return f"{_EN_TENS[tens]}-{_EN_ORDINALS[unit]}"


def en_year(y: int) -> str:
    # Years are read in pairs ("nineteen eighty-four"), except 2000-2009.
    if 2000 <= y < 2010:
        return en_cardinal(y)
    high, low = divmod(y, 100)
    if low == 0:
        return f"{_en_below_100(high)} hundred"
    if low < 10:
        return f"{_en_below_100(high)} oh {_EN_UNITS[low]}"
    return f"{_en_below_100(high)} {_en_below_100(low)}"


# ------------------------------------------------------------------------- German

_DE_UNITS = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
             "zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn",
             "achtzehn", "neunzehn"]
_DE_TENS = {2: "zwanzig", 3: "dreißig", 4: "vierzig", 5: "fünfzig", 6: "sechzig", 7: "siebzig",
            8: "achtzig", 9: "neunzig"}
_DE_ORDINAL_STEMS = {1: "ers", 3: "drit", 7: "sieb", 8: "ach"}


def _de_below_100(n: int) -> str:
    if n < 20:
        return _DE_UNITS[n]
    tens, unit = divmod(n, 10)
    if not unit:
        return _DE_TENS[tens]
    return ("ein" if unit == 1 else _DE_UNITS[unit]) + "und" + _DE_TENS[tens]


def _de_multiplier(n: int) -> str:
    return "ein" if n == 1 else _DE_UNITS[n]


def de_cardinal(n: int) -> str:
    # Written as one word; "einhundert"/"eintausend" mirror English "one hundred".
    # The standalone form ends in "eins" (101 = "einhunderteins"); the generator never puts
    # such a number before a noun, where German would need "ein"/"eine".
    if n == 0:
        return "null"
    thousands, rest = divmod(n, 1000)
    hundreds, below = divmod(rest, 100)
    out = ""
    if thousands:
        out += _de_multiplier(thousands) + "tausend"
    if hundreds:
        out += _de_multiplier(hundreds) + "hundert"
    if below:
        out += _de_below_100(below)
    return out


def de_ordinal_dative(n: int) -> str:
    """Day of the month after "am": "am ersten", "am dritten", "am einundzwanzigsten"."""
    if n < 20:
        return _DE_ORDINAL_STEMS.get(n, _DE_UNITS[n]) + "ten"
    return _de_below_100(n) + "sten"


def de_year(y: int) -> str:
    if y < 2000:
        high, low = divmod(y, 100)
        return _de_below_100(high) + "hundert" + (_de_below_100(low) if low else "")
    return de_cardinal(y)


# ------------------------------------------------------------------------ Spanish

_ES_UNITS = ["cero", "uno", "dos", "tres", "cuatro", "cinco", "seis", "siete", "ocho", "nueve",
             "diez", "once", "doce", "trece", "catorce", "quince", "dieciséis", "diecisiete",
             "dieciocho", "diecinueve", "veinte", "veintiuno", "veintidós", "veintitrés",
             "veinticuatro", "veinticinco", "veintiséis", "veintisiete", "veintiocho",
             "veintinueve"]
_ES_TENS = {3: "treinta", 4: "cuarenta", 5: "cincuenta", 6: "sesenta", 7: "setenta",
            8: "ochenta", 9: "noventa"}
_ES_HUNDREDS = {1: "ciento", 2: "doscientos", 3: "trescientos", 4: "cuatrocientos",
                5: "quinientos", 6: "seiscientos", 7: "setecientos", 8: "ochocientos",
                9: "novecientos"}


def _es_one(word: str, gender: str | None) -> str:
    """A number word ending in "uno" before a noun: "veintiún libros", "veintiuna casas"."""
    if gender is None or not word.endswith("uno"):
        return word
    if gender == "f":
        return word[:-1] + "a"
    return "veintiún" if word == "veintiuno" else word[:-1]


def _es_below_100(n: int, gender: str | None) -> str:
    if n < 30:
        return _es_one(_ES_UNITS[n], gender)
    tens, unit = divmod(n, 10)
    if not unit:
        return _ES_TENS[tens]
    return f"{_ES_TENS[tens]} y {_es_one(_ES_UNITS[unit], gender)}"


def es_cardinal(n: int, gender: str | None = None) -> str:
    """gender None: counting form ("veintiuno"); "m"/"f": before a masculine/feminine noun."""
    if n == 0:
        return "cero"
    thousands, rest = divmod(n, 1000)
    hundreds, below = divmod(rest, 100)
    parts = []
    if thousands:
        # "mil" is invariable and needs no "un"; 2-9 thousand is masculine-or-neutral "dos mil".
        parts.append("mil" if thousands == 1 else f"{_ES_UNITS[thousands]} mil")
    if hundreds:
        if hundreds == 1 and not below:
            parts.append("cien")
        else:
            word = _ES_HUNDREDS[hundreds]
            parts.append(word[:-2] + "as" if gender == "f" and hundreds > 1 else word)
    if below:
        parts.append(_es_below_100(below, gender))
    return " ".join(parts)


def es_day(n: int) -> str:
    return "primero" if n == 1 else es_cardinal(n)


# ------------------------------------------------------------------------- French

_FR_UNITS = ["zéro", "un", "deux", "trois", "quatre", "cinq", "six", "sept", "huit", "neuf",
             "dix", "onze", "douze", "treize", "quatorze", "quinze", "seize", "dix-sept",
             "dix-huit", "dix-neuf"]
_FR_TENS = {2: "vingt", 3: "trente", 4: "quarante", 5: "cinquante", 6: "soixante"}


def _fr_below_100(n: int, feminine: bool) -> str:
    # Traditional spelling (hyphens below 100 only, "et" in 21-71): "vingt et un",
    # "soixante et onze", "quatre-vingts", "quatre-vingt-un", "quatre-vingt-dix-sept".
    un = "une" if feminine else "un"
    if n == 1:
        return un
    if n < 20:
        return _FR_UNITS[n]
    tens, unit = divmod(n, 10)
    if tens <= 6:
        if unit == 0:
            return _FR_TENS[tens]
        if unit == 1:
            return f"{_FR_TENS[tens]} et {un}"
        return f"{_FR_TENS[tens]}-{_FR_UNITS[unit]}"
    if tens == 7:
        return "soixante et onze" if unit == 1 else f"soixante-{_FR_UNITS[10 + unit]}"
    if tens == 8:
        if unit == 0:
            return "quatre-vingts"
        return f"quatre-vingt-{un if unit == 1 else _FR_UNITS[unit]}"
    return f"quatre-vingt-{_FR_UNITS[10 + unit]}"


def fr_cardinal(n: int, feminine: bool = False) -> str:
    if n == 0:
        return "zéro"
    thousands, rest = divmod(n, 1000)
    hundreds, below = divmod(rest, 100)
    parts = []
    if thousands:
        parts.append("mille" if thousands == 1 else f"{_FR_UNITS[thousands]} mille")
    if hundreds:
        if hundreds == 1:
            parts.append("cent")
        else:
            # "deux cents" takes an s only when nothing follows it.
            parts.append(f"{_FR_UNITS[hundreds]} cent" + ("" if below else "s"))
    if below:
        parts.append(_fr_below_100(below, feminine))
    return " ".join(parts)


def fr_day(n: int) -> str:
    return "premier" if n == 1 else fr_cardinal(n)


def number_words(n: int, lang: str) -> str:
    """The cardinal number `n` (0-9999) written out as counted aloud in `lang` (en, de, es, fr)."""
    if not 0 <= n <= 9999:
        raise ValueError(f"number_words covers 0-9999, got {n}")
    writers = {"en": en_cardinal, "de": de_cardinal, "es": es_cardinal, "fr": fr_cardinal}
    if lang not in writers:
        raise ValueError(f"no number words for '{lang}'; have {', '.join(writers)}")
    return writers[lang](n)
