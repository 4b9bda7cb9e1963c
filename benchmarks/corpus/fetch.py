"""Fetch the real-code corpus (a split's manifest) into benchmarks/corpus/_repos*/ (gitignored).

Two splits: `dev` (manifest.json, fetched into _repos/: the code rules are read and tuned on) and
`test` (testset.json, into _repos_test/: repositories fetched fresh for issue 21 that are only
measured, never tuned on). `--split all` fetches both.

Each repository is fetched at its pinned commit (a shallow fetch of that one commit, then a
checkout), from GitHub by default or from a local mirror of bare repositories laid out as
`<mirror-root>/<owner>+<name>/repo` (or `<owner>+<name>` itself being the git directory).
torch's own sources are copied from the installed torch package when its version matches the
manifest (a mismatch is reported: the files differ, the figures are not comparable).

    python benchmarks/corpus/fetch.py                          # dev split, from GitHub
    python benchmarks/corpus/fetch.py --split test             # the held-out test split
    python benchmarks/corpus/fetch.py --mirror-root /work/.mirror
    AUTOOPT_CORPUS_MIRROR=/work/.mirror python benchmarks/corpus/fetch.py

A repository already present at the pinned commit is left as it is (re-running is cheap).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
DEFAULT_DEST = HERE / "_repos"
# split -> (manifest, default destination)
SPLITS = {
    "dev": (MANIFEST, DEFAULT_DEST),
    "test": (HERE / "testset.json", HERE / "_repos_test"),
    # First-contact batches (issue 30): labelled by reading before autoopt ever ran on them.
    "fresh-c": (HERE / "fresh_c.json", HERE / "_repos_fresh_c"),
    "fresh-d": (HERE / "fresh_d.json", HERE / "_repos_fresh_d"),
    "fresh-e": (HERE / "fresh_e.json", HERE / "_repos_fresh_e"),
    "fresh-f": (HERE / "fresh_f.json", HERE / "_repos_fresh_f"),
    "fresh-g": (HERE / "fresh_g.json", HERE / "_repos_fresh_g"),
    "fresh-h": (HERE / "fresh_h.json", HERE / "_repos_fresh_h"),
    "fresh-i": (HERE / "fresh_i.json", HERE / "_repos_fresh_i"),
    "fresh-j": (HERE / "fresh_j.json", HERE / "_repos_fresh_j"),
    "fresh-k": (HERE / "fresh_k.json", HERE / "_repos_fresh_k"),
    "fresh-l": (HERE / "fresh_l.json", HERE / "_repos_fresh_l"),
    "fresh-m": (HERE / "fresh_m.json", HERE / "_repos_fresh_m"),
    "fresh-n": (HERE / "fresh_n.json", HERE / "_repos_fresh_n"),
    "fresh-o": (HERE / "fresh_o.json", HERE / "_repos_fresh_o"),
    "fresh-p": (HERE / "fresh_p.json", HERE / "_repos_fresh_p"),
    "fresh-q": (HERE / "fresh_q.json", HERE / "_repos_fresh_q"),
    "fresh-r": (HERE / "fresh_r.json", HERE / "_repos_fresh_r"),
    "fresh-s": (HERE / "fresh_s.json", HERE / "_repos_fresh_s"),
    "fresh-t": (HERE / "fresh_t.json", HERE / "_repos_fresh_t"),
    "fresh-u": (HERE / "fresh_u.json", HERE / "_repos_fresh_u"),
    "fresh-v": (HERE / "fresh_v.json", HERE / "_repos_fresh_v"),
    "fresh-w": (HERE / "fresh_w.json", HERE / "_repos_fresh_w"),
    "fresh-x": (HERE / "fresh_x.json", HERE / "_repos_fresh_x"),
    "fresh-y": (HERE / "fresh_y.json", HERE / "_repos_fresh_y"),
    "fresh-z": (HERE / "fresh_z.json", HERE / "_repos_fresh_z"),
    "fresh-aa": (HERE / "fresh_aa.json", HERE / "_repos_fresh_aa"),
    "fresh-ab": (HERE / "fresh_ab.json", HERE / "_repos_fresh_ab"),
    "fresh-ac": (HERE / "fresh_ac.json", HERE / "_repos_fresh_ac"),
    "fresh-ad": (HERE / "fresh_ad.json", HERE / "_repos_fresh_ad"),
    "fresh-ae": (HERE / "fresh_ae.json", HERE / "_repos_fresh_ae"),
    "fresh-af": (HERE / "fresh_af.json", HERE / "_repos_fresh_af"),
    "fresh-ag": (HERE / "fresh_ag.json", HERE / "_repos_fresh_ag"),
    "fresh-ah": (HERE / "fresh_ah.json", HERE / "_repos_fresh_ah"),
    "fresh-ai": (HERE / "fresh_ai.json", HERE / "_repos_fresh_ai"),
    "fresh-aj": (HERE / "fresh_aj.json", HERE / "_repos_fresh_aj"),
    "fresh-ak": (HERE / "fresh_ak.json", HERE / "_repos_fresh_ak"),
    "fresh-al": (HERE / "fresh_al.json", HERE / "_repos_fresh_al"),
    "fresh-am": (HERE / "fresh_am.json", HERE / "_repos_fresh_am"),
    "fresh-an": (HERE / "fresh_an.json", HERE / "_repos_fresh_an"),
    "fresh-ao": (HERE / "fresh_ao.json", HERE / "_repos_fresh_ao"),
    "fresh-ap": (HERE / "fresh_ap.json", HERE / "_repos_fresh_ap"),
    "fresh-aq": (HERE / "fresh_aq.json", HERE / "_repos_fresh_aq"),
    "fresh-ar": (HERE / "fresh_ar.json", HERE / "_repos_fresh_ar"),
    "fresh-as": (HERE / "fresh_as.json", HERE / "_repos_fresh_as"),
    "fresh-at": (HERE / "fresh_at.json", HERE / "_repos_fresh_at"),
    "fresh-au": (HERE / "fresh_au.json", HERE / "_repos_fresh_au"),
    "fresh-av": (HERE / "fresh_av.json", HERE / "_repos_fresh_av"),
    "fresh-aw": (HERE / "fresh_aw.json", HERE / "_repos_fresh_aw"),
    "fresh-ax": (HERE / "fresh_ax.json", HERE / "_repos_fresh_ax"),
}
TORCH_DIR = "torch"


def load_manifest(path: Path = MANIFEST) -> dict:
    """The manifest: `repos` (name, url, commit, paths) and `torch` (version, paths)."""
    return json.loads(path.read_text(encoding="utf-8"))


def repo_dir(dest: Path, name: str) -> Path:
    """Where a repository `owner/name` is checked out."""
    return dest / name.replace("/", "+")


def mirror_source(mirror_root: Path | None, name: str) -> str | None:
    """The local bare mirror of `owner/name`, if the mirror root holds one."""
    if mirror_root is None:
        return None
    base = mirror_root / name.replace("/", "+")
    for candidate in (base / "repo", base / "repo" / ".git", base):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return str(candidate)
    return None


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


MARKER = ".corpus_commit"


def present_commit(path: Path) -> str | None:
    """The commit a previous run put in `path`, if any."""
    marker = path / MARKER
    return marker.read_text().strip() if marker.is_file() else None


def extract_from_mirror(git_dir: str, commit: str, paths: list[str], target: Path) -> int:
    """Write the commit's files from a bare mirror; returns how many blobs the mirror lacks.

    A mirror may leave out its largest blobs (data, weights), so files are read one by one
    (`git cat-file --batch`) rather than with `git archive`, which stops at the first gap.
    """
    listing = git("--git-dir", git_dir, "ls-tree", "-r", "-z", commit, "--", *paths)
    entries = []
    for record in filter(None, listing.split("\0")):
        meta, name = record.split("\t", 1)
        mode, kind, sha = meta.split()
        if kind == "blob":
            entries.append((sha, name, mode == _SYMLINK))
    batch = subprocess.run(
        ["git", "--git-dir", git_dir, "cat-file", "--batch"],
        input="".join(f"{sha}\n" for sha, _, _ in entries).encode(),
        check=True,
        capture_output=True,
    ).stdout
    missing, pos = 0, 0
    for _sha, name, link in entries:
        header_end = batch.index(b"\n", pos)
        header = batch[pos:header_end].split()
        pos = header_end + 1
        if header[-1] == b"missing":
            missing += 1
            continue
        size = int(header[2])
        out = target / name
        out.parent.mkdir(parents=True, exist_ok=True)
        data = batch[pos : pos + size]
        pos += size + 1  # the contents are followed by a newline
        if link:
            _symlink(out, data.decode(), target)
        else:
            out.write_bytes(data)
    return missing


_SYMLINK = "120000"  # git's mode for a symbolic link: the blob holds the link's target


def _symlink(out: Path, points_to: str, root: Path) -> None:
    """Make the link git records (CVPR19_Incremental_Learning's `utils_incremental ->
    ../utils_incremental/`), as a checkout does; a link that leaves the repository is not
    made (the corpus is other people's code)."""
    resolved = (out.parent / points_to).resolve()
    if resolved == root.resolve() or root.resolve() in resolved.parents:
        out.symlink_to(points_to)


def fetch_repo(entry: dict, dest: Path, mirror_root: Path | None) -> str:
    """Put one repository's files at its pinned commit under `dest`; returns what was done."""
    target = repo_dir(dest, entry["name"])
    commit = entry["commit"]
    if present_commit(target) == commit:
        return "present"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    paths = [p for p in entry.get("paths", ["."]) if p != "."]
    mirror = mirror_source(mirror_root, entry["name"])
    if mirror:
        missing = extract_from_mirror(mirror, commit, paths, target)
        how = f"mirror ({missing} blobs absent from the mirror)" if missing else "mirror"
    else:
        git("init", "-q", cwd=target)
        # One commit, no history: GitHub serves a pinned sha to a shallow fetch.
        git("fetch", "-q", "--depth", "1", entry["url"], commit, cwd=target)
        git("checkout", "-q", "FETCH_HEAD", *(["--", *paths] if paths else []), cwd=target)
        shutil.rmtree(target / ".git")
        how = "github"
    (target / MARKER).write_text(commit + "\n")
    return how


def copy_torch(spec: dict, dest: Path) -> str:
    """Copy the manifest's subset of the installed torch package's sources."""
    found = importlib.util.find_spec("torch")
    if found is None or not found.submodule_search_locations:
        return "skipped: torch is not installed"
    root = Path(next(iter(found.submodule_search_locations)))
    version = importlib.metadata.version("torch").split("+")[0]
    target = dest / TORCH_DIR
    if target.exists():
        shutil.rmtree(target)
    for sub in spec["paths"]:
        for path in (root / sub).rglob("*.py"):
            out = target / path.relative_to(root)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out)
    note = "" if version == spec["version"] else f" (manifest pins {spec['version']})"
    return f"copied from torch {version}{note}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--split", choices=(*SPLITS, "all"), default="dev", help="which manifest (default dev)"
    )
    parser.add_argument(
        "--dest", type=Path, help="cache folder (default _repos/ for dev, _repos_test/ for test)"
    )
    parser.add_argument(
        "--mirror-root",
        type=Path,
        default=os.environ.get("AUTOOPT_CORPUS_MIRROR"),
        help="folder of local bare mirrors <owner>+<name>[/repo] (env AUTOOPT_CORPUS_MIRROR)",
    )
    parser.add_argument("--only", action="append", help="fetch only these repos (owner/name)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch's own sources")
    args = parser.parse_args(argv)

    failures = 0
    for split in SPLITS if args.split == "all" else (args.split,):
        path, default_dest = SPLITS[split]
        if not path.is_file():  # a batch whose manifest is not written yet
            continue
        dest = args.dest or default_dest
        failures += fetch_split(load_manifest(path), dest, args)
    return 1 if failures else 0


def fetch_split(manifest: dict, dest: Path, args: argparse.Namespace) -> int:
    """Fetch one manifest's repositories (and torch's sources, if it names them) into DEST;
    returns how many failed."""
    dest.mkdir(parents=True, exist_ok=True)
    failures = 0
    for entry in manifest["repos"]:
        if args.only and entry["name"] not in args.only:
            continue
        try:
            how = fetch_repo(entry, dest, args.mirror_root)
        except subprocess.CalledProcessError as exc:
            failures += 1
            how = f"FAILED: {exc.stderr.strip() or exc}"
        print(f"{entry['name']:45} {entry['commit'][:12]}  {how}", file=sys.stderr)
    if "torch" in manifest and not args.no_torch and not args.only:
        print(f"{'torch':45} {'':12}  {copy_torch(manifest['torch'], dest)}", file=sys.stderr)
    return failures


if __name__ == "__main__":
    sys.exit(main())
