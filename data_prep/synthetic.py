"""The embedded knowledge base: fictional entities, Wikipedia-style passages, QA with hops.

Everything derives from one ``random.Random(seed)`` (no set iteration, no hashing of
strings), so a seed gives byte-identical files on any machine. Names come from syllable
pools, so no model can know the answers: it has to search.

World: cities (in fictional countries), people (birth year, birthplace, occupation,
employer), organisations (founder, founding year, headquarters city) and works (author,
publication year). Names come in families on purpose (shared first names, shared or
near-identical surnames, one organisation stem with several suffixes, one title stem with
several nouns): every entity is also a distractor for its relatives, so retrieval has to
match the exact name.

Passages (``"Title"\\n`` + 40-120 words, varied templates): a city passage; two per person
(biography: birth year and birthplace; career: employer, organisations founded, works
written); one per organisation (founder, founding year, headquarters); one per work
(author, year). Each fact a question uses is stated in exactly the passage its hop points
to, next to the entity's own name, so a hop query retrieves one passage that answers it.

Questions (``kind``): ``single`` (one attribute), ``bridge`` (two hops: "In which city was
the founder of Y born?"), ``comparison`` ("Who was born first, X or Z?"). Per row:
``support_ids[i]`` is the passage answering ``hop_queries[i]`` with ``hop_answers[i]``;
``golden_answers[0]`` is the canonical answer as passages write it, followed by aliases
(a person's full name with middle name, as the biography's first sentence gives it).

Knowledge-base kinds (``generate_kb(kind=...)``, ``synthetic --kind``): ``standard`` (the
default, above: every name unique, so the demonstrations' hop queries, the name and what is
asked, are the best searches there are) and ``lookalike``, a knowledge base with room above
imitation (issue 85). There people come in groups of 2-4 namesakes (same first name and
surname) with different birth years, birthplaces (of different stems) and occupations, and a
question about a person gives, beside the name, the attribute that tells the namesakes
apart: the birthplace when it asks the birth year ("When was Orla Venn of Varnholt born?"),
the occupation when it asks the birthplace ("Where was the painter Orla Venn born?"); a
founder's or author's birth year question gives the birthplace too. A search for the name
alone (`hop_queries`: what the demonstrations search, what a user scripts) brings a
namesake's passage first about 2 times in 3, the name with the attribute
(`attribute_queries`) mostly the right one (`benchmarks/kb_headroom.py` measures both).
Only a person's biography names their birthplace and occupation among the namesakes'
passages, so that a search with one finds it. Questions about organisations alone keep
unique names. Per row also `hop_attributes` (the attribute each hop's attribute query adds,
"" for none) and `namesakes` (how many entities have the name each hop searches). The
standard kind is byte-for-byte what it was for a seed.

Train/test split: people together with the organisations they founded and the works they
wrote form clusters; clusters (and cities) are assigned to train or test, and a question
belongs to a split only if every entity it names or passes through is in that split. So
no test question shares text or entities with a train question (final answers such as
a city or a year may of course recur, and so may a lookalike question's attribute: a city or
an occupation that only tells namesakes apart, whose own passage no hop reads).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from data_prep.atomic import COMPLETE, check_replaceable, replace_dir, temp_dir_beside
from data_prep.io import write_jsonl
from data_prep.qa import normalize_question

# ---------------------------------------------------------------------------------------
# names

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r",
           "s", "st", "t", "th", "tr", "v", "z", "sh", "c", "cl", "j", "qu", "w"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou", "y"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "x", "m", "nd", "rk", "st", "v", "sk"]
_F_END = ["a", "ia", "elle", "ine", "wyn", "ra", "ette", "is"]
_M_END = ["an", "or", "ek", "us", "in", "ald", "o", "en"]
_SUR_SUFFIX = ["", "", "en", "ick", "sen", "holt", "mar", "ov", "ard", "ley", "ner", "wick", "by", "ing"]
_CITY_SUFFIX = ["holt", "mere", "vale", "port", "stead", "wick", "haven", "gard", "mouth", "burg", "field", "crest"]
_COUNTRY_SUFFIX = ["ia", "and", "ova", "esh", "mark", "ania", "or"]
_ORG_SUFFIX = {
    "Labs": "research laboratory", "Systems": "technology company", "Group": "holding company",
    "Institute": "research institute", "Works": "engineering firm", "Press": "publishing house",
    "Foundation": "charitable foundation", "Company": "trading company",
    "Industries": "manufacturing company", "Bank": "bank", "Shipping": "shipping company",
    "Mills": "textile manufacturer", "Observatory": "observatory",
}
_NAMESAKES = [2, 2, 3, 3, 4]
"""Sizes of the lookalike kind's groups of people with one name: a person is one of 3 on
average, so a name-only search that lands on one of them at random finds the right one 5 times
in 14."""
_TITLE_NOUNS = ["Tide", "Gate", "Winter", "Harbour", "Crown", "Lantern", "Orchard", "Letters",
                "Bridge", "Garden", "Song", "Voyage", "Mirror", "Archive", "Frontier", "Weaver"]
_GENRES = ["novel", "poetry collection", "history", "play", "essay collection", "travelogue", "biography"]
_OCC_FOUNDER = ["engineer", "industrialist", "chemist", "merchant", "banker", "inventor",
                "physician", "architect", "shipbuilder", "publisher"]
_OCC_AUTHOR = ["novelist", "poet", "historian", "playwright", "essayist", "journalist"]
_OCC_OTHER = ["painter", "composer", "botanist", "astronomer", "mathematician", "sculptor",
              "cartographer", "diplomat", "teacher", "surveyor"]
# Generated tokens that happen to be real, well-known names or words are rejected.
_BLOCK = {
    "paris", "rome", "london", "berlin", "troy", "mars", "venus", "adam", "eve", "anna",
    "maria", "mary", "john", "jesus", "moses", "sarah", "david", "peter", "paul", "luke",
    "mark", "linda", "nina", "lena", "elena", "dora", "vera", "ivan", "boris", "oslo",
    "lima", "bern", "riga", "kiev", "cairo", "delhi", "dublin", "malta", "crete", "india",
    "china", "japan", "korea", "chad", "mali", "iran", "iraq", "cuba", "peru", "laos",
    "oman", "togo", "niger", "sudan", "kenya", "gabon", "bonn", "hamburg", "cambridge",
    "oxford", "bradford", "stratford", "portsmouth", "plymouth", "sheffield", "hull",
    "newton", "darwin", "tesla", "kant", "marx", "lenin", "stalin", "homer", "plato",
    "nero", "cicero", "caesar", "thor", "odin", "zeus", "hera", "apollo", "athena",
}


def _syllable(rng: random.Random, coda: bool) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + (rng.choice(_CODAS) if coda else "")


def _word(rng: random.Random, n_syll: int, ending: str = "") -> str:
    # inner syllables mostly open (Ta-ven, not Tand-vern), so names stay pronounceable
    while True:
        w = "".join(_syllable(rng, k == n_syll - 1 or rng.random() < 0.25) for k in range(n_syll)) + ending
        if 4 <= len(w) <= 11 and w not in _BLOCK and not any(b in w for b in ("sex", "nazi", "kill")):
            return w.capitalize()


def _unique_words(rng: random.Random, n: int, make, used: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        w = make()
        if w.lower() not in used:
            used.add(w.lower())
            out.append(w)
    return out


def _article(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


# ---------------------------------------------------------------------------------------
# the world


@dataclass
class City:
    name: str
    country: str
    region: str
    kind: str
    test: bool = False
    pid: str = ""
    stem: str = ""
    """The stem it shares with near-identical names (Varn- of Varnholt, Varnhaven)."""


@dataclass
class Person:
    first: str
    surname: str
    middle: str | None
    female: bool
    birth: int
    death: int | None
    birthplace: int
    occupation: str
    family: str  # surname stem: relatives in name
    employer: int | None = None
    joined: int | None = None
    founded: list[int] = field(default_factory=list)
    wrote: list[int] = field(default_factory=list)
    test: bool = False
    bio_pid: str = ""
    career_pid: str = ""

    @property
    def name(self) -> str:
        return f"{self.first} {self.surname}"

    @property
    def full(self) -> str:
        return f"{self.first} {self.middle} {self.surname}" if self.middle else self.name

    @property
    def aliases(self) -> list[str]:
        return [self.name] + ([self.full] if self.middle else [])


@dataclass
class Org:
    name: str
    stem: str
    industry: str
    founder: int
    year: int
    hq: int
    test: bool = False
    pid: str = ""


@dataclass
class Work:
    title: str
    stem: str
    genre: str
    author: int
    year: int
    setting: int
    test: bool = False
    pid: str = ""


@dataclass
class World:
    countries: list[str]
    cities: list[City]
    people: list[Person]
    orgs: list[Org]
    works: list[Work]
    lookalike: bool = False
    """People share names (`_namesakes`); only a biography says a person's occupation."""


def _namesakes(rng: random.Random, left: int, most: int) -> int:
    """How many people of the lookalike kind share the next name: 2 to 4 and at most `most`
    (namesakes are born in cities of different stems), never leaving a last group of one
    (`left` people are still to be made)."""
    most = min(most, max(_NAMESAKES))
    size = min(rng.choice(_NAMESAKES), left, most)
    if left - size == 1:
        size = size + 1 if size < most else size - 1
    return size


def _build_world(rng: random.Random, n_entities: int, lookalike: bool = False) -> World:
    """The entities of a knowledge base; `lookalike`: people come in groups of 2-4 with the
    same name (`_namesakes`), told apart by birth year and birthplace."""
    n_cities = max(8, round(n_entities * 0.08))
    n_orgs = max(4, round(n_entities * 0.24))
    n_works = max(4, round(n_entities * 0.20))
    n_people = max(8, n_entities - n_cities - n_orgs - n_works)
    used: set[str] = set()

    countries = _unique_words(rng, max(4, min(12, n_cities // 12)),
                              lambda: _word(rng, 2, rng.choice(_COUNTRY_SUFFIX)), used)
    # City stems are shared by two or three cities (Varnholt, Varnhaven): near-identical names.
    city_stems = _unique_words(rng, max(3, n_cities // 2), lambda: _word(rng, rng.choice([1, 1, 2])), used)
    cities = []
    city_names: set[str] = set()
    while len(cities) < n_cities:
        stem = rng.choice(city_stems)
        name = stem + rng.choice(_CITY_SUFFIX)
        if name.lower() in used or name.lower() in _BLOCK or name in city_names:
            continue
        city_names.add(name)
        cities.append(City(name, rng.choice(countries), rng.choice(["north", "south", "east", "west", "centre"]),
                           rng.choice(["city", "port city", "market town", "river town", "cathedral city", "mountain town"]),
                           stem=stem))
    used |= {c.name.lower() for c in cities}

    # People: first names and surname stems are reused so names collide partially.
    firsts_f = _unique_words(rng, max(4, n_people // 10), lambda: _word(rng, 1, rng.choice(_F_END)), used)
    firsts_m = _unique_words(rng, max(4, n_people // 10), lambda: _word(rng, 1, rng.choice(_M_END)), used)
    stems = _unique_words(rng, max(4, n_people // 8), lambda: _word(rng, rng.choice([1, 1, 2])), used)
    reserved = used - {s.lower() for s in stems}  # a surname must not be a city or first name
    people: list[Person] = []
    names: set[str] = set()
    while len(people) < n_people:
        female = rng.random() < 0.5
        pool = firsts_f if female else firsts_m
        first = rng.choice(pool)
        stem = rng.choice(stems)
        surname = stem + rng.choice(_SUR_SUFFIX)
        if f"{first} {surname}" in names or surname.lower() in _BLOCK or surname.lower() in reserved:
            continue
        names.add(f"{first} {surname}")
        size = _namesakes(rng, n_people - len(people), len({c.stem for c in cities})) if lookalike else 1
        births: list[int] = []
        places: list[int] = []
        while len(births) < size:
            birth = rng.randint(1780, 1950)
            death = birth + rng.randint(48, 96)
            middle = rng.choice(pool) if rng.random() < 0.3 else None
            if middle == first:
                middle = None
            birthplace = rng.randrange(n_cities)
            # namesakes are told apart by birth year and birthplace: both differ, and the
            # birthplaces are not near-identical names (Varnholt, Varnhaven) either
            if any(abs(birth - b) < 5 for b in births) or cities[birthplace].stem in {cities[c].stem for c in places}:
                continue
            births.append(birth)
            places.append(birthplace)
            people.append(Person(first, surname, middle, female, birth, death if death <= 2020 else None,
                                 birthplace, rng.choice(_OCC_OTHER), stem))
    used |= {p.surname.lower() for p in people}

    # Organisations: a stem with several suffixes (Zentrix Labs, Zentrix Press) plus
    # one-letter spelling variants of some stems (Zentrex Labs).
    org_stems = _unique_words(rng, max(2, n_orgs // 3), lambda: _word(rng, 2), used)
    for s in list(org_stems[: len(org_stems) // 4]):
        v = s[:-1] + rng.choice([c for c in "aeiouy" if c != s[-1]]) if s[-1] in "aeiouy" else s + "a"
        if v.lower() not in used:
            used.add(v.lower())
            org_stems.append(v)
    orgs: list[Org] = []
    org_names: set[str] = set()
    while len(orgs) < n_orgs:
        stem = rng.choice(org_stems)
        suffix = rng.choice(list(_ORG_SUFFIX))
        name = f"{stem} {suffix}"
        if name in org_names:
            continue
        org_names.add(name)
        founder = rng.randrange(n_people)
        p = people[founder]
        year = min(2015, p.death or 2015, p.birth + rng.randint(24, 60))  # founded in their lifetime
        orgs.append(Org(name, stem, _ORG_SUFFIX[suffix], founder, year, rng.randrange(n_cities)))
        p.founded.append(len(orgs) - 1)

    # Works: authors come from a writer subset so writers have several works each.
    writers = rng.sample(range(n_people), max(2, min(n_people, n_works * 2 // 3)))
    title_stems = _unique_words(rng, max(2, n_works // 3), lambda: _word(rng, 2), used)
    works: list[Work] = []
    titles: set[str] = set()
    while len(works) < n_works:
        stem, noun = rng.choice(title_stems), rng.choice(_TITLE_NOUNS)
        title = rng.choice([f"The {stem} {noun}", f"{noun} of {stem}", f"The {noun} of {stem}"])
        # EM normalisation drops articles: "The Tide of X" and "Tide of X" would be one answer
        if normalize_question(title) in titles:
            continue
        titles.add(normalize_question(title))
        author = rng.choice(writers)
        p = people[author]
        year = min(p.death or 2020, p.birth + rng.randint(22, 70))
        works.append(Work(title, stem, rng.choice(_GENRES), author, year, rng.randrange(n_cities)))
        p.wrote.append(len(works) - 1)

    for i, p in enumerate(people):
        if p.founded:
            p.occupation = rng.choice(_OCC_FOUNDER)
        elif p.wrote:
            p.occupation = rng.choice(_OCC_AUTHOR)
        joined = p.birth + rng.randint(19, 40)
        options = [j for j, o in enumerate(orgs) if o.year <= joined and o.founder != i]
        if options:
            p.employer, p.joined = rng.choice(options), joined
    if lookalike:  # and by occupation: each namesake has their own
        taken: dict[str, set[str]] = {}
        for p in people:
            had = taken.setdefault(p.name, set())
            if p.occupation in had:
                pool = _OCC_FOUNDER if p.founded else _OCC_AUTHOR if p.wrote else _OCC_OTHER
                p.occupation = rng.choice([o for o in pool if o not in had])
            had.add(p.occupation)
    return World(countries, cities, people, orgs, works, lookalike)


def _assign_splits(rng: random.Random, w: World, test_frac: float) -> None:
    """A `test_frac` share of surname families (each person with the organisations they
    founded and the works they wrote) and of cities go to test. Whole families, so that
    "who was born first" pairs of relatives exist inside each split."""
    n_test_cities = max(1, round(test_frac * len(w.cities)))
    for i in rng.sample(range(len(w.cities)), n_test_cities):
        w.cities[i].test = True
    families = list(dict.fromkeys(p.family for p in w.people))
    test_families = set(rng.sample(families, max(1, round(test_frac * len(families)))))
    for p in w.people:
        p.test = p.family in test_families
        for j in p.founded:
            w.orgs[j].test = p.test
        for j in p.wrote:
            w.works[j].test = p.test


# ---------------------------------------------------------------------------------------
# passages


def _fill(rng: random.Random, lead: list[str], fillers: list[str], lo: int = 40, hi: int = 120) -> str:
    """Lead sentences (the facts) plus shuffled filler sentences up to a random length
    within [lo, hi] words."""
    target = rng.randint(lo + 8, hi - 25)
    text = " ".join(lead)
    pool = fillers[:]
    rng.shuffle(pool)
    for s in pool:
        n = len(text.split())
        if n >= target or n + len(s.split()) > hi:
            if n >= lo:
                break
            continue
        text += " " + s
    assert lo <= len(text.split()) <= hi, (len(text.split()), text)
    return text


def _people_passages(rng: random.Random, w: World, i: int, kin: list[Person] = ()) -> tuple[str, str]:
    """A person's biography and career passage. `kin`: the lookalike kind's namesakes (the
    person among them), whose birthplaces and occupations tell them apart: neither passage
    mentions them beyond the person's own in the biography, so that a search for the name with
    one of them finds its biography and no namesake's passage."""
    p = w.people[i]
    city = w.cities[p.birthplace].name
    homes = {k.birthplace for k in kin}

    def some_city() -> City:
        while True:
            c = w.cities[rng.randrange(len(w.cities))]
            if c.name not in {w.cities[h].name for h in homes}:
                return c

    spouses = [o for o in _OCC_OTHER if o not in {k.occupation for k in kin}]
    other = some_city().name
    pron, pos, obj = ("she", "her", "her") if p.female else ("he", "his", "him")
    Pron, Pos = pron.capitalize(), pos.capitalize()
    occ = p.occupation
    end = p.death or 2020
    y = lambda a, b: rng.randint(min(p.birth + a, end), min(p.birth + b, end))  # noqa: E731
    if p.death:
        lead = rng.choice([
            f"{p.full} ({p.birth}–{p.death}) was {_article(occ)} born in {city}.",
            f"{p.full} was {_article(occ)}. {Pron} was born in {city} in {p.birth} and died in {p.death}.",
            f"Born in {city} in {p.birth}, {p.full} was {_article(occ)} who died in {p.death}.",
            f"{p.full} was born in {p.birth} in {city} and became {_article(occ)}; {pron} died in {p.death}.",
        ])
    else:
        lead = rng.choice([
            f"{p.full} (born {p.birth} in {city}) is {_article(occ)}.",
            f"{p.full} is {_article(occ)}. {Pron} was born in {city} in {p.birth}.",
            f"Born in {city} in {p.birth}, {p.full} is {_article(occ)}.",
        ])
    bio_fill = [
        f"{p.surname} was the {rng.choice(['eldest', 'second', 'third', 'youngest'])} of {rng.randint(3, 7)} children.",
        f"{Pron} studied at the {_word(rng, 2)} Academy in {other}.",
        f"{Pron} was known for {rng.choice(['a meticulous working style', 'long walking tours', 'an extensive correspondence', 'a large private library', 'popular public lectures', 'a sharp wit'])}.",
        f"In {y(20, 35)}, {pron} married {_article(rng.choice(spouses))} from {other}.",
        f"{p.surname} spent {pos} early years in {city}, where {pos} family kept a small {rng.choice(['bakery', 'bookshop', 'farm', 'workshop', 'inn'])}.",
        f"{Pos} letters and notebooks are kept in the municipal archive of {other}.",
        f"{Pron} received the {_word(rng, 2)} Medal in {y(30, 60)}.",
        f"A portrait of {p.surname} hangs in the town hall of {city}.",
        f"Friends remembered {obj} as {rng.choice(['generous', 'reserved', 'stubborn', 'curious', 'cheerful'])} and {rng.choice(['hard-working', 'quick-tempered', 'modest', 'witty'])}.",
    ]
    bio = _fill(rng, [lead], bio_fill)

    facts = []
    for j in p.founded:
        o = w.orgs[j]
        facts.append(rng.choice([f"{p.surname} founded {o.name} in {o.year}.",
                                 f"In {o.year}, {pron} established {o.name}."]))
    for j in p.wrote[:3]:
        wk = w.works[j]
        facts.append(rng.choice([f"{Pron} wrote {wk.title}, published in {wk.year}.",
                                 f"{Pos} {wk.genre} {wk.title} appeared in {wk.year}."]))
    if p.employer is not None:
        facts.insert(0, f"From {p.joined} {pron} worked for {w.orgs[p.employer].name}.")
    career_fill = [
        f"{p.surname} retired in {y(55, 70)}.",
        f"{Pron} travelled widely in {some_city().country}.",
        f"{Pron} served on the board of the {_word(rng, 2)} Society.",
        f"{Pos} methods influenced a generation of younger {'colleagues' if kin else occ + 's'}.",
        f"Colleagues described {obj} as {rng.choice(['demanding but fair', 'tireless', 'impatient with routine', 'an excellent mentor' if kin else 'an excellent teacher'])}.",
        f"In {y(30, 50)} {pron} gave a celebrated lecture in {other}.",
        f"{Pron} kept a workshop in {some_city().name} for many years.",
        f"Several of {pos} students later became well known in their own right.",
    ]
    # with namesakes, a career passage stating the occupation would answer a search for it in
    # place of the biography
    began = f"{p.name} began {pos} career in {other}." if kin else \
        f"{p.name} began {pos} career as {_article(occ)} in {other}."
    career = _fill(rng, [began] + facts[:5], career_fill)
    return bio, career


def _org_passage(rng: random.Random, w: World, o: Org) -> str:
    founder, city = w.people[o.founder].name, w.cities[o.hq].name
    other = w.cities[rng.randrange(len(w.cities))].name
    lead = rng.choice([
        f"{o.name} is {_article(o.industry)} headquartered in {city}. It was founded in {o.year} by {founder}.",
        f"{o.name} is {_article(o.industry)} based in {city}, founded by {founder} in {o.year}.",
        f"Founded in {o.year} by {founder}, {o.name} is {_article(o.industry)} with its headquarters in {city}.",
        f"{founder} founded {o.name} in {o.year}. The {o.industry} has its headquarters in {city}.",
    ])
    later = min(2020, o.year + rng.randint(5, 60))
    fill = [
        f"It employs about {rng.randint(2, 90) * 10} people.",
        f"It opened a branch office in {other} in {later}.",
        f"The name comes from an old word for {rng.choice(['river', 'hill', 'bridge', 'harbour', 'lantern', 'mill'])} in a local dialect.",
        f"The organisation was reorganised in {min(2020, o.year + rng.randint(10, 80))}.",
        f"Its archive holds records going back to its first years.",
        f"Its emblem shows {_article(rng.choice(['heron', 'key', 'wheel', 'star', 'oak leaf', 'ship']))}.",
        f"It has been led by a board of {rng.randint(3, 9)} directors since {later}.",
        f"Its early growth depended on contracts with the government of {rng.choice(w.countries)}.",
    ]
    return _fill(rng, [lead], fill)


def _work_passage(rng: random.Random, w: World, wk: Work) -> str:
    author, setting = w.people[wk.author].name, w.cities[wk.setting].name
    lead = rng.choice([
        f"{wk.title}, {_article(wk.genre)} by {author}, was first published in {wk.year}.",
        f"{wk.title} is {_article(wk.genre)} by {author}, first published in {wk.year}.",
        f"Written by {author}, {wk.title} is {_article(wk.genre)} first published in {wk.year}.",
        f"{author} wrote the {wk.genre} {wk.title}, which was first published in {wk.year}.",
    ])
    fill = [
        f"It is set in {setting}.",
        f"A revised edition appeared in {wk.year + rng.randint(3, 40)}.",
        f"It was translated into {rng.randint(2, 14)} languages.",
        f"Critics praised its {rng.choice(['careful structure', 'vivid descriptions', 'dry humour', 'precise language', 'unusual narrator'])}.",
        f"A stage adaptation premiered in {w.cities[rng.randrange(len(w.cities))].name}.",
        f"The first printing ran to {rng.randint(5, 40) * 100} copies.",
        f"The manuscript is kept in a private collection.",
        f"It is often read alongside other works of the period.",
    ]
    return _fill(rng, [lead], fill)


def _city_passage(rng: random.Random, w: World, c: City) -> str:
    lead = rng.choice([
        f"{c.name} is {_article(c.kind)} in {c.country}.",
        f"{c.name} is {_article(c.kind)} in the {c.region} of {c.country}.",
        f"Located in the {c.region} of {c.country}, {c.name} is {_article(c.kind)}.",
    ])
    fill = [
        f"It lies on the {_word(rng, 2)} River.",
        f"It has a population of about {rng.randint(3, 400) * 1000}.",
        f"The settlement was first recorded in {rng.randint(900, 1600)}.",
        f"Its old quarter is known for {rng.choice(['narrow stone lanes', 'painted gables', 'a covered market', 'canal bridges', 'a clock tower'])}.",
        f"{c.name} is linked to {w.cities[rng.randrange(len(w.cities))].name} by rail.",
        f"The local economy depends on {rng.choice(['fishing', 'weaving', 'mining', 'trade', 'farming', 'tourism'])}.",
        f"A large fair is held there every {rng.choice(['spring', 'summer', 'autumn', 'winter'])}.",
        f"The town hall dates from the {rng.randint(14, 19)}th century.",
    ]
    return _fill(rng, [lead], fill)


def _write_passages(rng: random.Random, w: World) -> list[dict]:
    passages: list[dict] = []

    def add(title: str, text: str) -> str:
        pid = str(len(passages))
        passages.append({"id": pid, "contents": f'"{title}"\n{text}'})
        return pid

    for c in w.cities:
        c.pid = add(c.name, _city_passage(rng, w, c))
    kin: dict[str, list[Person]] = {}
    for p in w.people if w.lookalike else ():
        kin.setdefault(p.name, []).append(p)
    for i, p in enumerate(w.people):
        bio, career = _people_passages(rng, w, i, kin.get(p.name, []))
        p.bio_pid = add(p.name, bio)
        p.career_pid = add(p.name, career)
    for o in w.orgs:
        o.pid = add(o.name, _org_passage(rng, w, o))
    for wk in w.works:
        wk.pid = add(wk.title, _work_passage(rng, w, wk))
    return passages


# ---------------------------------------------------------------------------------------
# questions


@dataclass
class _Q:
    kind: str
    relation: str
    question: str
    answers: list[str]
    support_ids: list[str]
    hop_queries: list[str]
    hop_answers: list[str]
    keys: list[tuple[str, int]]  # entities named or passed through (decide the split)
    attribute_queries: list[str] | None = None
    """The lookalike kind's: each hop query with the attribute that tells its person from the
    namesakes (the question gives it) put after the name; the hop query where there is none."""
    hop_attributes: list[str] | None = None
    """The lookalike kind's: per hop, that attribute ("" where the hop needs none)."""
    namesakes: list[int] | None = None
    """The lookalike kind's: per hop, how many entities have the name its hop query searches
    (1: the name is unique)."""


def _candidates(rng: random.Random, w: World) -> list[_Q]:
    qs: list[_Q] = []
    P, O, W, C = w.people, w.orgs, w.works, w.cities

    def q(kind, rel, templates, answers, support, hq, ha, keys, **fmt):
        qs.append(_Q(kind, rel, rng.choice(templates).format(**fmt), answers, support, hq, ha, keys))

    for i, p in enumerate(P):
        city = C[p.birthplace]
        q("single", "birth_year", ["In what year was {x} born?", "When was {x} born?", "What year was {x} born in?",
                                   "In which year was {x} born?"],
          [str(p.birth)], [p.bio_pid], [f"{p.name} birth year"], [str(p.birth)], [("p", i)], x=p.name)
        q("single", "birthplace", ["Where was {x} born?", "In which city was {x} born?", "What is the birthplace of {x}?",
                                   "What city was {x} born in?"],
          [city.name], [p.bio_pid], [f"{p.name} birthplace"], [city.name], [("p", i)], x=p.name)
        q("bridge", "birthplace>country", ["In which country was {x} born?", "{x} was born in which country?"],
          [city.country], [p.bio_pid, city.pid], [f"{p.name} birthplace", f"{city.name} country"],
          [city.name, city.country], [("p", i), ("c", p.birthplace)], x=p.name)
    for j, o in enumerate(O):
        f, city = P[o.founder], C[o.hq]
        q("single", "founder", ["Who founded {x}?", "Who was the founder of {x}?", "{x} was founded by whom?",
                                "Which person founded {x}?"],
          f.aliases, [o.pid], [f"founder of {o.name}"], [f.name], [("o", j), ("p", o.founder)], x=o.name)
        q("single", "founding_year", ["In what year was {x} founded?", "When was {x} founded?",
                                      "What year was {x} established?"],
          [str(o.year)], [o.pid], [f"{o.name} founding year"], [str(o.year)], [("o", j)], x=o.name)
        q("single", "headquarters", ["Where is {x} headquartered?", "In which city is {x} based?",
                                     "In what city are the headquarters of {x}?"],
          [city.name], [o.pid], [f"{o.name} headquarters"], [city.name], [("o", j)], x=o.name)
        q("bridge", "founder>birthplace", ["In which city was the founder of {x} born?", "Where was the founder of {x} born?",
                                           "What is the birthplace of the person who founded {x}?"],
          [C[f.birthplace].name], [o.pid, f.bio_pid], [f"founder of {o.name}", f"{f.name} birthplace"],
          [f.name, C[f.birthplace].name], [("o", j), ("p", o.founder)], x=o.name)
        q("bridge", "founder>birth_year", ["In what year was the founder of {x} born?", "When was the founder of {x} born?"],
          [str(f.birth)], [o.pid, f.bio_pid], [f"founder of {o.name}", f"{f.name} birth year"],
          [f.name, str(f.birth)], [("o", j), ("p", o.founder)], x=o.name)
        q("bridge", "headquarters>country", ["In which country is {x} headquartered?",
                                             "In what country are the headquarters of {x}?"],
          [city.country], [o.pid, city.pid], [f"{o.name} headquarters", f"{city.name} country"],
          [city.name, city.country], [("o", j), ("c", o.hq)], x=o.name)
    for k, wk in enumerate(W):
        a = P[wk.author]
        q("single", "author", ["Who wrote {x}?", "Who is the author of {x}?", "{x} was written by whom?"],
          a.aliases, [wk.pid], [f"author of {wk.title}"], [a.name], [("w", k), ("p", wk.author)], x=wk.title)
        q("single", "publication_year", ["In what year was {x} published?", "When was {x} first published?"],
          [str(wk.year)], [wk.pid], [f"{wk.title} publication year"], [str(wk.year)], [("w", k)], x=wk.title)
        q("bridge", "author>birthplace", ["Where was the author of {x} born?", "In which city was the writer of {x} born?"],
          [C[a.birthplace].name], [wk.pid, a.bio_pid], [f"author of {wk.title}", f"{a.name} birthplace"],
          [a.name, C[a.birthplace].name], [("w", k), ("p", wk.author)], x=wk.title)
        q("bridge", "author>birth_year", ["In what year was the author of {x} born?", "When was the author of {x} born?"],
          [str(a.birth)], [wk.pid, a.bio_pid], [f"author of {wk.title}", f"{a.name} birth year"],
          [a.name, str(a.birth)], [("w", k), ("p", wk.author)], x=wk.title)
    for m, c in enumerate(C):
        q("single", "country", ["In which country is {x}?", "{x} is in which country?", "Which country is {x} located in?"],
          [c.country], [c.pid], [f"{c.name} country"], [c.country], [("c", m)], x=c.name)

    for a_, b_ in _pairs(rng, P, lambda x: [x.first, x.family]):
        a, b = P[a_], P[b_]
        if a.birth != b.birth:
            win = a if a.birth < b.birth else b
            q("comparison", "born_first", ["Who was born first, {a} or {b}?", "Who was born earlier, {a} or {b}?",
                                           "Who is older, {a} or {b}?"],
              win.aliases, [a.bio_pid, b.bio_pid], [f"{a.name} birth year", f"{b.name} birth year"],
              [str(a.birth), str(b.birth)], [("p", a_), ("p", b_)], a=a.name, b=b.name)
    for a_, b_ in _pairs(rng, O, lambda x: [x.stem]):
        a, b = O[a_], O[b_]
        if a.year != b.year:
            win = a if a.year < b.year else b
            q("comparison", "founded_first", ["Which was founded first, {a} or {b}?", "Which is older, {a} or {b}?",
                                              "Which was established earlier, {a} or {b}?"],
              [win.name], [a.pid, b.pid], [f"{a.name} founding year", f"{b.name} founding year"],
              [str(a.year), str(b.year)], [("o", a_), ("o", b_)], a=a.name, b=b.name)
    for a_, b_ in _pairs(rng, W, lambda x: [x.stem]):
        a, b = W[a_], W[b_]
        if a.year != b.year:
            win = a if a.year < b.year else b
            q("comparison", "published_first", ["Which was published first, {a} or {b}?",
                                                "Which came out earlier, {a} or {b}?"],
              [win.title], [a.pid, b.pid], [f"{a.title} publication year", f"{b.title} publication year"],
              [str(a.year), str(b.year)], [("w", a_), ("w", b_)], a=a.title, b=b.title)
    return _unique(qs)


def _lookalike_candidates(rng: random.Random, w: World) -> list[_Q]:
    """The lookalike kind's questions. Every question about a person gives, beside the name
    it shares with 1-3 namesakes, one attribute that tells them apart: the birthplace when it
    asks for the birth year, the occupation when it asks for the birthplace. (On the dev KB,
    seed 7, with the default dense encoder, the right namesake's biography came first for 33%
    of the name-only searches, 89% with the birthplace, 78% with the occupation, and 42% with
    the birth year, which the encoder barely tells apart: so no question gives a year.) The
    hop queries (what demonstrations search) name the person only, as a user's script would;
    the attribute queries add the attribute. A bridge through an organisation's founder or a work's
    author gives the person's birthplace: its second hop searches the name the first one found
    (with the birthplace, in the attribute query). Questions about an organisation alone are
    the standard kind's: unique names, both strategies the same search."""
    qs: list[_Q] = []
    P, O, C = w.people, w.orgs, w.cities
    namesakes = Counter(p.name for p in P)

    def q(kind, rel, templates, answers, support, hops, ha, keys, **fmt):
        """`hops`: per hop (its query, the name it searches, the attribute or "")."""
        hq = [query for query, _, _ in hops]
        aq = [query.replace(name, f"{name} {attr}", 1) if attr else query for query, name, attr in hops]
        qs.append(_Q(kind, rel, rng.choice(templates).format(**fmt), answers, support, hq, ha, keys,
                     aq, [attr for _, _, attr in hops], [namesakes.get(name, 1) for _, name, _ in hops]))

    for i, p in enumerate(P):
        city = C[p.birthplace]
        q("single", "birth_year", ["In what year was {x} of {c} born?", "When was {x} of {c} born?",
                                   "In which year was the {x} from {c} born?", "When was the {x} from {c} born?"],
          [str(p.birth)], [p.bio_pid], [(f"{p.name} birth year", p.name, city.name)], [str(p.birth)], [("p", i)],
          x=p.name, c=city.name)
        q("single", "birthplace", ["Where was the {occ} {x} born?", "In which city was the {occ} {x} born?",
                                   "What is the birthplace of {x}, the {occ}?", "What city was the {occ} {x} born in?"],
          [city.name], [p.bio_pid], [(f"{p.name} birthplace", p.name, p.occupation)], [city.name], [("p", i)],
          x=p.name, occ=p.occupation)
        q("bridge", "birthplace>country", ["In which country was the {occ} {x} born?",
                                           "What is the country of birth of {x}, the {occ}?"],
          [city.country], [p.bio_pid, city.pid], [(f"{p.name} birthplace", p.name, p.occupation),
                                                  (f"{city.name} country", city.name, "")],
          [city.name, city.country], [("p", i), ("c", p.birthplace)], x=p.name, occ=p.occupation)
    for j, o in enumerate(O):
        f, city = P[o.founder], C[o.hq]
        q("single", "founder", ["Who founded {x}?", "Who was the founder of {x}?", "{x} was founded by whom?",
                                "Which person founded {x}?"],
          f.aliases, [o.pid], [(f"founder of {o.name}", o.name, "")], [f.name], [("o", j), ("p", o.founder)], x=o.name)
        q("single", "founding_year", ["In what year was {x} founded?", "When was {x} founded?",
                                      "What year was {x} established?"],
          [str(o.year)], [o.pid], [(f"{o.name} founding year", o.name, "")], [str(o.year)], [("o", j)], x=o.name)
        home = C[f.birthplace].name
        q("bridge", "founder>birth_year", ["In what year was the founder of {x}, a native of {c}, born?",
                                           "When was the founder of {x}, who came from {c}, born?"],
          [str(f.birth)], [o.pid, f.bio_pid], [(f"founder of {o.name}", o.name, ""), (f"{f.name} birth year", f.name, home)],
          [f.name, str(f.birth)], [("o", j), ("p", o.founder)], x=o.name, c=home)
    for k, wk in enumerate(w.works):
        a = P[wk.author]
        home = C[a.birthplace].name
        q("bridge", "author>birth_year", ["In what year was the author of {x}, a native of {c}, born?",
                                          "When was the writer of {x}, who came from {c}, born?"],
          [str(a.birth)], [wk.pid, a.bio_pid], [(f"author of {wk.title}", wk.title, ""), (f"{a.name} birth year", a.name, home)],
          [a.name, str(a.birth)], [("w", k), ("p", wk.author)], x=wk.title, c=home)
    for a_, b_ in _pairs(rng, P, lambda x: [x.first, x.family]):
        a, b = P[a_], P[b_]
        if a.birth != b.birth and a.name != b.name:  # namesakes' answer would be either
            win = a if a.birth < b.birth else b
            ca, cb = C[a.birthplace].name, C[b.birthplace].name
            q("comparison", "born_first", ["Who was born first, {a} of {ca} or {b} of {cb}?",
                                           "Who was born earlier, the {a} from {ca} or the {b} from {cb}?"],
              win.aliases, [a.bio_pid, b.bio_pid], [(f"{a.name} birth year", a.name, ca), (f"{b.name} birth year", b.name, cb)],
              [str(a.birth), str(b.birth)], [("p", a_), ("p", b_)], a=a.name, b=b.name, ca=ca, cb=cb)
    for a_, b_ in _pairs(rng, O, lambda x: [x.stem]):
        a, b = O[a_], O[b_]
        if a.year != b.year:
            win = a if a.year < b.year else b
            q("comparison", "founded_first", ["Which was founded first, {a} or {b}?", "Which is older, {a} or {b}?",
                                              "Which was established earlier, {a} or {b}?"],
              [win.name], [a.pid, b.pid], [(f"{a.name} founding year", a.name, ""), (f"{b.name} founding year", b.name, "")],
              [str(a.year), str(b.year)], [("o", a_), ("o", b_)], a=a.name, b=b.name)
    return _unique(qs)


def _pairs(rng: random.Random, items: list, family) -> list[tuple[int, int]]:
    """Comparison pairs: relatives (same first name or surname stem, same organisation or
    title stem: each `family(item)` key) so the two retrievals must tell near-identical names
    apart, plus some random pairs; both members always come from the same split."""
    out = []
    for flag in (False, True):
        split = [i for i in range(len(items)) if items[i].test == flag]
        groups: dict[str, list[int]] = {}
        for i in split:
            for key in family(items[i]):
                groups.setdefault(key, []).append(i)
        for members in groups.values():
            out += list(zip(members, members[1:]))
        if len(split) > 1:
            out += [tuple(rng.sample(split, 2)) for _ in range(len(split) // 2)]
    return [(a, b) if rng.random() < 0.5 else (b, a) for a, b in out]


def _unique(qs: list[_Q]) -> list[_Q]:
    """The same pair can come from two families (or a random draw): keep one question."""
    seen, unique = set(), []
    for x in qs:
        key = (x.relation, tuple(sorted(x.support_ids)))
        if key not in seen:
            seen.add(key)
            unique.append(x)
    return unique


_KIND_SHARE = {"single": 0.4, "bridge": 0.35, "comparison": 0.25}


def _sample(rng: random.Random, cands: list[_Q], n: int) -> list[_Q]:
    """Up to `n` questions in the kind shares above, spread evenly over relations
    (round robin), topping up from other kinds when one runs short."""
    by_kind: dict[str, dict[str, list[_Q]]] = {k: {} for k in _KIND_SHARE}
    for c in cands:
        by_kind[c.kind].setdefault(c.relation, []).append(c)
    queues = {}
    for kind, rels in by_kind.items():
        for lst in rels.values():
            rng.shuffle(lst)
        order, lists = [], list(rels.values())
        while any(lists):
            for lst in lists:
                if lst:
                    order.append(lst.pop())
        queues[kind] = order
    want = {k: round(n * s) for k, s in _KIND_SHARE.items()}
    picked = {k: queues[k][: want[k]] for k in want}
    short = n - sum(len(v) for v in picked.values())
    for k in _KIND_SHARE:  # top up
        extra = queues[k][len(picked[k]): len(picked[k]) + max(short, 0)]
        picked[k] += extra
        short -= len(extra)
    out = [q for k in _KIND_SHARE for q in picked[k]]
    rng.shuffle(out)
    return out


def _entity_test(w: World, key: tuple[str, int]) -> bool:
    kind, i = key
    return {"p": w.people, "o": w.orgs, "w": w.works, "c": w.cities}[kind][i].test


def _rows(qs: list[_Q], split: str) -> list[dict]:
    """The QA rows; a lookalike question's carry its `attribute_queries`, `hop_attributes`
    and `namesakes` too."""
    return [{
        "id": f"kb_{split}_{i}", "question": q.question, "golden_answers": q.answers,
        "data_source": "kb", "split": split, "kind": q.kind, "relation": q.relation,
        "support_ids": q.support_ids, "hop_queries": q.hop_queries, "hop_answers": q.hop_answers,
        **({} if q.attribute_queries is None else {
            "attribute_queries": q.attribute_queries, "hop_attributes": q.hop_attributes, "namesakes": q.namesakes}),
    } for i, q in enumerate(qs)]


# ---------------------------------------------------------------------------------------
# reading a passage

_FACTS = {
    # a passage states its own facts in its first sentence(s), before any filler sentence
    "birth_year": re.compile(r"\b(\d{4})\b"),  # a biography's first year
    "founding_year": re.compile(r"\b(\d{4})\b"),  # an organisation's first year
    "publication_year": re.compile(r"\b(\d{4})\b"),  # a work's first year
    "birthplace": re.compile(r"\b[Bb]orn (?:\d{4} in |in \d{4} in |in )([A-Z][\w'-]*)"),
    "country": re.compile(r"\bin (?:the \w+ of )?([A-Z][\w'-]*)"),
    "headquarters": re.compile(r"\b(?:headquartered|based|headquarters) in ([A-Z][\w'-]*)"),
    "founder": re.compile(r"\bby ([A-Z][\w'-]* [A-Z][\w'-]*)|^([A-Z][\w'-]* [A-Z][\w'-]*) founded\b"),
    "author": re.compile(r"\bby ([A-Z][\w'-]* [A-Z][\w'-]*)|^([A-Z][\w'-]* [A-Z][\w'-]*) wrote\b"),
}
_COMPARED = {"born_first": "birth_year", "founded_first": "founding_year", "published_first": "publication_year"}


def hop_facts(relation: str) -> list[str]:
    """The fact each hop of a `relation` question reads: "founder>birthplace" -> founder,
    then birthplace; "born_first" -> birth_year twice."""
    if relation in _COMPARED:
        return [_COMPARED[relation]] * 2
    return relation.split(">")


def read_fact(fact: str, text: str) -> str | None:
    """What a passage's text (without its title line) says about `fact` ("birth_year",
    "birthplace", "country", "founder", ...), read the way a scripted reader reads it: from the
    passage's first sentences, whatever entity the passage is about; None where it says none.
    On a question's own support passage it gives the hop answer (tests/data_prep check it)."""
    m = _FACTS[fact].search(text)
    return None if m is None else next(g for g in m.groups() if g)


KB_FILES = ("corpus.jsonl", "train.parquet", "test.parquet", "kb_meta.json")
"""What `generate_kb` writes (and the COMPLETE marker, last)."""


def kb_finished(out_dir: str | Path) -> bool:
    """Whether `out_dir` holds a knowledge base `generate_kb` finished: its COMPLETE marker, or
    (written before the marker existed) every one of its files."""
    out = Path(out_dir)
    return (out / COMPLETE).is_file() or all((out / name).is_file() for name in KB_FILES)


KB_KINDS = ("standard", "lookalike")
"""`standard`: unique names, the hop queries the best searches; `lookalike`: people share
names, and a search for the name alone finds a namesake about 2 times in 3 where the question's
attribute put into the query finds the right one (module docstring)."""


def generate_kb(out_dir: str | Path, seed: int = 0, n_entities: int = 2000,
                n_train: int = 5000, n_test: int = 500, kind: str = "standard") -> dict:
    """Generate the knowledge base into `out_dir`: ``corpus.jsonl``, ``train.parquet``,
    ``test.parquet`` (and ``kb_meta.json`` with the seed and counts). Returns the counts.

    Fewer questions than asked are written when the world is too small to supply them
    (the returned counts say how many).

    The files are Search-R1's own names, so `out_dir` is written only when it is absent,
    empty, or a knowledge base this function completed (its `.complete` marker) holding
    nothing else; anything else raises FileExistsError before any work. The set is written
    into a temporary sibling directory and renamed into place (`data_prep.atomic`): a failure
    or a kill leaves the earlier set whole, never old and new files side by side."""
    import pandas as pd

    if kind not in KB_KINDS:
        raise ValueError(f"kind {kind!r}: one of {', '.join(KB_KINDS)}")
    lookalike = kind == "lookalike"
    out = Path(out_dir)
    check_replaceable(out, COMPLETE, "a generated knowledge base", "choose another --out, or move it away first",
                      own=KB_FILES)
    t0 = time.time()
    rng = random.Random(seed)
    world = _build_world(rng, n_entities, lookalike)
    test_frac = min(0.5, max(0.08, 1.5 * n_test / max(1, n_train + n_test)))
    _assign_splits(rng, world, test_frac)
    passages = _write_passages(rng, world)
    cands = (_lookalike_candidates if lookalike else _candidates)(rng, world)
    pools = {"train": [], "test": []}
    for c in cands:
        flags = {_entity_test(world, k) for k in c.keys}
        if flags == {True}:
            pools["test"].append(c)
        elif flags == {False}:
            pools["train"].append(c)
    test = _sample(rng, pools["test"], n_test)
    test_text = {normalize_question(q.question) for q in test}
    train = _sample(rng, [c for c in pools["train"] if normalize_question(c.question) not in test_text], n_train)

    kinds = {s: {k: sum(q.kind == k for q in qs) for k in _KIND_SHARE} for s, qs in (("train", train), ("test", test))}
    stats = {
        "seed": seed, "entities": len(world.cities) + len(world.people) + len(world.orgs) + len(world.works),
        "cities": len(world.cities), "people": len(world.people), "organisations": len(world.orgs),
        "works": len(world.works), "passages": len(passages), "train": len(train), "test": len(test),
        "kinds": kinds,
    }
    if lookalike:  # the standard kind's file stays as it was
        names = Counter(p.name for p in world.people)
        stats["kb_kind"] = kind
        stats["names_shared"] = sum(n > 1 for n in names.values())
        stats["questions_with_namesakes"] = {s: sum(max(q.namesakes) > 1 for q in qs)
                                             for s, qs in (("train", train), ("test", test))}
    tmp = temp_dir_beside(out)
    try:
        write_jsonl(passages, tmp / "corpus.jsonl")
        for split, qs in (("train", train), ("test", test)):
            pd.DataFrame(_rows(qs, split)).to_parquet(tmp / f"{split}.parquet", index=False)
        (tmp / "kb_meta.json").write_text(json.dumps(stats, indent=1) + "\n")
        (tmp / COMPLETE).write_text(f"seed {seed}\n" + (f"kind {kind}\n" if lookalike else ""))
        replace_dir(tmp, out)  # fsyncs the set, then one rename
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    stats["seconds"] = round(time.time() - t0, 2)
    return stats
