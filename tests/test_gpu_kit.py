"""scripts/gpu_kit.py: the pieces reassemble byte-identical, and the manifest catches a
damaged or missing piece (the kit that carries vLLM to a lent GPU machine, docs/gpu.md)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gpu_kit  # noqa: E402

PIECE = 8192


def _tree(root: Path, seed: int, files: int) -> dict[str, bytes]:
    """Files of random (incompressible) and repetitive bytes, some in sub-folders."""
    rnd = random.Random(seed)
    made = {}
    for i in range(files):
        rel = f"site/pkg{seed}/{'sub/' if i % 2 else ''}f{i}.bin"
        data = rnd.randbytes(rnd.randint(1, 6000)) + b"x" * rnd.randint(0, 3000)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        made[rel] = data
    return made


@pytest.fixture()
def kit(tmp_path):
    parts, want = [], {}
    for seed, files in ((1, 3), (2, 7), (3, 1)):
        tree = tmp_path / "stage" / f"p{seed}"
        want.update(_tree(tree, seed, files))
        parts.append(gpu_kit.Part(f"p{seed}", tree))
    manifest = gpu_kit.pack(parts, tmp_path / "kit", piece_bytes=PIECE)
    return tmp_path / "kit", manifest, want, parts


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".parts" not in p.parts}


def test_pieces_reassemble_the_stream_and_unpack_byte_identical(kit, tmp_path):
    kit_dir, manifest, want, parts = kit
    pieces = sorted(kit_dir.glob("piece-*.bin"))
    assert len(pieces) == len(manifest["pieces"]) >= 3  # parts span pieces at this piece size
    assert all(p.stat().st_size <= PIECE for p in pieces)
    assert all(p.stat().st_size == PIECE for p in pieces[:-1])
    stream = b"".join(p.read_bytes() for p in pieces)
    assert len(stream) == manifest["stream_bytes"]
    assert hashlib.sha256(stream).hexdigest() == manifest["stream_sha256"]
    # each part's byte range is exactly its own xz tar (deterministic: packing again gives the same bytes)
    for part, entry in zip(parts, manifest["parts"]):
        assert stream[entry["offset"]: entry["offset"] + entry["size"]] == gpu_kit._tar_xz(part.tree)

    # only the pieces and the manifest travel: unpack them in a fresh folder
    there = tmp_path / "there"
    there.mkdir()
    for p in [*pieces, kit_dir / gpu_kit.MANIFEST]:
        shutil.copy(p, there / p.name)
    state = gpu_kit.unpack(there)
    assert set(state["pieces"].values()) == {"ok"}
    assert set(state["parts"].values()) == {"unpacked"}
    assert _files(there / "root") == want
    # a second call unpacks nothing again
    assert set(gpu_kit.unpack(there)["parts"].values()) == {"already"}


def test_a_damaged_or_missing_piece_is_named_and_its_parts_wait(kit, tmp_path):
    kit_dir, manifest, want, _ = kit
    there = tmp_path / "there"
    shutil.copytree(kit_dir, there)
    names = [p["file"] for p in manifest["pieces"]]
    last = names[-1]
    # flip one byte of the last piece (same size: only the sha256 can tell), drop the second
    data = bytearray((there / last).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (there / last).write_bytes(bytes(data))
    (there / names[1]).unlink()

    state = gpu_kit.unpack(there)
    assert state["pieces"][last] == "damaged: sha256 differs from the manifest"
    assert state["pieces"][names[1]] == "missing"
    for entry in manifest["parts"]:
        needs = {names[i] for i in gpu_kit._pieces_of(entry, manifest)}
        s = state["parts"][entry["name"]]
        if needs & {last, names[1]}:
            assert s.startswith("waiting for ") and all(n in s for n in sorted(needs & {last, names[1]}))
        else:
            assert s == "unpacked"
    assert not gpu_kit.report(state)

    # a truncated piece is caught by its size
    (there / names[1]).write_bytes((kit_dir / names[1]).read_bytes()[:-1])
    assert gpu_kit.check_pieces(there, manifest)[names[1]].startswith("damaged: 8191 bytes")

    # the good pieces arrive: the rest unpacks, what was unpacked is not unpacked again
    shutil.copy(kit_dir / last, there / last)
    shutil.copy(kit_dir / names[1], there / names[1])
    state = gpu_kit.unpack(there)
    assert "waiting" not in " ".join(state["parts"].values())
    assert "already" in state["parts"].values()
    assert _files(there / "root") == want


def test_unpack_exit_code_and_a_manifest_of_another_build(kit, tmp_path, capsys):
    kit_dir, manifest, _, _ = kit
    there = tmp_path / "there"
    shutil.copytree(kit_dir, there)
    os.remove(there / manifest["pieces"][-1]["file"])
    assert gpu_kit.main(["unpack", "--kit", str(there), "--require-all"]) == 1
    assert "missing" in capsys.readouterr().out
    # pieces intact but the manifest's part hash from another build: refused, not unpacked
    m = json.loads((kit_dir / gpu_kit.MANIFEST).read_text())
    m["parts"][0]["sha256"] = "0" * 64
    other = tmp_path / "other"
    shutil.copytree(kit_dir, other)
    (other / gpu_kit.MANIFEST).write_text(json.dumps(m))
    assert gpu_kit.unpack(other)["parts"][m["parts"][0]["name"]].startswith("damaged")
    with pytest.raises(SystemExit, match="no manifest"):
        gpu_kit.unpack(tmp_path)


def test_the_benchmarks_cpu_stages_travel_without_weights_and_unpack_as_they_were(tmp_path):
    """`scripts/gpu_check.sh rl-vs-sft-pack`: the KB, demonstrations and settings of a
    benchmarks/rl_vs_sft workdir, what the GPU run reuses, and nothing else (the policy's
    weights are rebuilt there; earlier arms would be reused as if they had run there)."""
    import subprocess
    import tarfile

    work = tmp_path / "runs" / "gpu_rvs"
    kept = {"kb/test.parquet": b"t" * 300, "kb/.complete": b"", "kb/corpus.jsonl": b'{"id": 1}\n',
            "demos/kb_train.parquet": os.urandom(2000), "settings.json": b'{"kb_seed": 101}\n'}
    left = {"model/model.safetensors": os.urandom(4000), "seed1/start/metrics.jsonl": b"{}\n",
            "kb_index_flat/meta.json": b"{}"}
    for rel, data in {**kept, **left}.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    pack = tmp_path / "rvs.tar.xz"
    subprocess.run(["bash", "scripts/gpu_check.sh", "rl-vs-sft-pack"], cwd=Path(__file__).resolve().parents[1],
                   env={**os.environ, "RVS_DIR": str(work), "RVS_PACK": str(pack)}, check=True, capture_output=True)
    with tarfile.open(pack) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    assert files == {f"gpu_rvs/{rel}": data for rel, data in kept.items()}

