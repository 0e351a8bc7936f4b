"""Shared, session-scoped fixtures: a tiny corpus written by the test, its indexes, a server.

The corpus has 200 passages: 12 hand-written "needles" with distinctive facts (the known
questions below must retrieve them) and 188 filler passages of varied topics. Building
it, a flat index and a BM25 index takes a few seconds with the default MiniLM encoder.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

NEEDLES = [
    ("Glimmerfen Lighthouse", "The Glimmerfen Lighthouse was built in 1873 on the island of Varnholm by the engineer "
     "Odile Prasker. Its lamp burned whale oil until 1921.", "Who built the Glimmerfen Lighthouse?"),
    ("Quorvath pastry", "Quorvath is a layered pastry from the mountain town of Teskelby, filled with juniper honey "
     "and roasted chestnuts, eaten at the winter solstice.", "What is quorvath pastry filled with?"),
    ("Ilsabet Marrowind", "Ilsabet Marrowind was a cartographer who mapped the Sunken Archipelago in 1702 and died in "
     "the port city of Hallowmere.", "Which archipelago did Ilsabet Marrowind map?"),
    ("Drennic violin", "The drennic violin has seven strings tuned in fourths and is played with a curved bow made of "
     "yew wood in the folk music of Ostravia.", "How many strings does the drennic violin have?"),
    ("Pellucid Moth", "The pellucid moth has transparent wings and lives only in the cloud forests of Mount Ketterel, "
     "feeding on the nectar of blue orchids.", "Where does the pellucid moth live?"),
    ("Battle of Sorrowgate", "The Battle of Sorrowgate was fought in 1488 between the Duchy of Amberlane and the "
     "Vessarian League; it ended with the capture of the river fortress.", "Who fought the Battle of Sorrowgate?"),
    ("Thunderkelp", "Thunderkelp is a giant seaweed that produces electric pulses and grows along the cold coast of "
     "Nordhaven, where divers harvest it for batteries.", "Which seaweed produces electric pulses?"),
    ("Copperwick Observatory", "Copperwick Observatory houses a brass refracting telescope used by astronomer Teodor "
     "Blaine to discover the comet Blaine-Farrow in 1911.", "Which comet did Teodor Blaine discover?"),
    ("Marzipan Railway", "The Marzipan Railway is a narrow gauge line that carried almonds from the orchards of "
     "Dulcey valley to the confectioners of Port Sable.", "What did the Marzipan Railway carry?"),
    ("Vexmoor Cheese", "Vexmoor cheese is aged for nine years in limestone caves and has a rind washed with "
     "blackberry brandy.", "How long is Vexmoor cheese aged?"),
    ("Orrin Splendagast", "Orrin Splendagast was a chess grandmaster who won the Kolvari championship eleven times "
     "and invented the Splendagast gambit.", "Which chess gambit did Orrin Splendagast invent?"),
    ("Sapphire Geyser", "The Sapphire Geyser erupts every forty minutes and its water is coloured deep blue by copper "
     "minerals in the volcanic basin of Ardent Hollow.", "Why is the water of the Sapphire Geyser blue?"),
]

_TOPICS = ["river", "castle", "festival", "bird", "mountain", "ship", "painter", "novel", "bridge", "garden",
           "market", "temple", "engine", "forest", "island", "choir", "harbor", "mill", "library", "canal"]
_PLACES = ["Aldmere", "Brisk", "Corven", "Dunhallow", "Eskerby", "Fallowmoor", "Greystead", "Harrowgate",
           "Ivywick", "Jorvale"]
_VERBS = ["was founded", "was restored", "became famous", "was first recorded", "was rebuilt", "was celebrated"]
_EXTRAS = ["by local farmers", "after a great flood", "during the reign of a forgotten king", "by travelling monks",
           "with money from the wool trade", "under the guidance of a merchant guild"]


def write_tiny_corpus(path: Path, n: int = 200, seed: int = 0) -> list[dict]:
    """Needles first (ids n0..), then filler passages f0..; returns the rows written."""
    rng = random.Random(seed)
    rows = [{"id": f"n{i}", "contents": f'"{t}"\n{body}'} for i, (t, body, _) in enumerate(NEEDLES)]
    for i in range(n - len(NEEDLES)):
        topic, place = rng.choice(_TOPICS), rng.choice(_PLACES)
        title = f"{place} {topic} {i}"
        body = (f"The {topic} of {place} {rng.choice(_VERBS)} in {rng.randint(1200, 1999)} "
                f"{rng.choice(_EXTRAS)}. It is number {i} in the regional register and is visited "
                f"{rng.choice(['often', 'rarely', 'in summer', 'at dawn'])}.")
        rows.append({"id": f"f{i}", "contents": f'"{title}"\n{body}', "source": "filler"})
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return rows


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_tiny_corpus(path)
    return path


@pytest.fixture(scope="session")
def encoder():
    from data_prep.encoder import Encoder

    return Encoder("minilm")


@pytest.fixture(scope="session")
def flat_index(tiny_corpus, encoder, tmp_path_factory) -> Path:
    from data_prep.indexing import build_index

    out = tmp_path_factory.mktemp("idx") / "flat"
    build_index(tiny_corpus, out, kind="flat", encoder=encoder, batch_size=64, progress=False)
    return out


@pytest.fixture(scope="session")
def bm25_index(tiny_corpus, tmp_path_factory) -> Path:
    from data_prep.indexing import build_index

    out = tmp_path_factory.mktemp("idx") / "bm25"
    build_index(tiny_corpus, out, kind="bm25", progress=False)
    return out


@pytest.fixture(scope="session")
def flat_searcher(flat_index, tiny_corpus):
    """In-process reference with the server's default query encoder (whatever `auto` picks on
    this host): a query's vector does not depend on its batch mates, so the server's batched
    answers must equal these."""
    from data_prep.indexing import load_searcher

    return load_searcher(flat_index, tiny_corpus)


@pytest.fixture(scope="session")
def retriever_server(flat_index, tiny_corpus):
    """A real server process on the tiny flat index, default encoder: yields (base_url, process)."""
    from retriever_server.launch import start_server, stop_server, wait_healthy

    proc, url = start_server(flat_index, tiny_corpus, extra_args=["--max-wait-ms", "5", "--log-level", "warning"])
    try:
        wait_healthy(url, timeout=180, proc=proc)
        yield url, proc
    finally:
        stop_server(proc)


def same_ranking(got: list[tuple[str, float]], want: list[tuple[str, float]], tol: float = 1e-3) -> bool:
    """Equal scores (within tol) rank by rank and equal ids, except at a near-tie of the reference
    (float results differ in the last bits between batch shapes, so exact ties may flip)."""
    if len(got) != len(want):
        return False
    for j, ((gid, gs), (wid, ws)) in enumerate(zip(got, want)):
        if abs(gs - ws) > tol:
            return False
        if gid != wid:
            neighbours = [want[i][1] for i in (j - 1, j + 1) if 0 <= i < len(want)]
            last = j == len(want) - 1  # the runner-up beyond topk is unknown
            if not last and not any(abs(n - ws) <= tol for n in neighbours):
                return False
    return True


# test modules cannot import conftest (pytest's importlib mode): hand the helpers out as fixtures
@pytest.fixture(scope="session")
def needles() -> list[tuple[str, str, str]]:
    """(title, passage, question) of the needles; needle i has id f"n{i}"."""
    return NEEDLES


@pytest.fixture(scope="session")
def ranking_matches():
    return same_ranking
