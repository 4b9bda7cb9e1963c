"""The issue-21 measurement harness judges edits by itself: pyflakes' undefined names before vs
after an edit, the --wrap verdicts, and the run shim that stops a real script after N optimizer
steps. These check that each judgement can say "broken"."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from benchmarks import corpus_eval, run_scripts

BEFORE = textwrap.dedent(
    """
    import torch
    model = torch.nn.Linear(2, 2)
    if USE_ADAM:
        opt = torch.optim.Adam(model.parameters())
    """
)


def test_new_name_errors_sees_an_unbound_name_an_edit_introduced() -> None:
    after = BEFORE + "model, optimizer = autoopt.optimize(model, optimizer=optimizer)\n"
    assert corpus_eval.new_name_errors(BEFORE, after) == [
        "UndefinedName autoopt",
        "UndefinedName optimizer",
    ]
    bound = BEFORE.replace("import torch", "import torch\nimport autoopt")
    bound += "model, opt = autoopt.optimize(model, optimizer=opt)\n"
    assert corpus_eval.new_name_errors(BEFORE, bound) == []


def test_wrap_verdicts() -> None:
    wrap = {"expect": "wrap", "pattern": "device=device"}
    call = "q, opt = autoopt.optimize(q, optimizer=opt)"
    assert corpus_eval.wrap_verdict("wrapped", "", [call], [], wrap) == "wrapped, wrong call"
    with_device = call.replace(")", ", device=device)")
    assert corpus_eval.wrap_verdict("wrapped", "", [with_device], [], wrap) == "wrapped right"
    assert corpus_eval.wrap_verdict("wrapped", "", [call], ["UndefinedName x"], wrap) == "broken"
    decline = {"expect": "decline", "pattern": "wrapper|step_and_update_lr"}
    wrong = "no optimizer is stepped where .backward() runs"
    assert corpus_eval.wrap_verdict("declined", wrong, [], [], decline) == "declined, wrong reason"
    assert corpus_eval.wrap_verdict("declined", wrong, [], [], wrap) == "declined, should wrap"
    assert corpus_eval.wrap_verdict("declined", wrong, [], [], {}) is None


SCRIPT = textwrap.dedent(
    """
    import torch
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(50):
        opt.zero_grad()
        model(torch.randn(4, 2)).sum().backward()
        opt.step()
    print("ran all 50 steps")
    """
)


@pytest.mark.slow  # a subprocess that imports torch
def test_run_shim_ends_a_script_after_n_optimizer_steps(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    outcome = run_scripts.execute({"script": "train.py"}, script, steps=2, timeout=120)
    assert outcome["status"] == "pass", outcome
    broken = tmp_path / "broken.py"
    broken.write_text(SCRIPT.replace("opt.step()", "opt.step(); undefined_name"))
    outcome = run_scripts.execute({"script": "broken.py"}, broken, steps=2, timeout=120)
    assert outcome["status"] == "fail"
    assert "NameError" in outcome["error"]


def test_run_all_runs_a_variant_identical_to_an_earlier_one_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two rewrites that make the same file: the second takes the first's outcome, not a run.
    (tmp_path / "owner+repo").mkdir()
    (tmp_path / "owner+repo" / "train.py").write_text("print('train')\n")
    monkeypatch.setattr(run_scripts, "ROOTS", {"test": tmp_path})
    edits = {"original": "", "a": "# edit\n", "b": "# edit\n", "c": "# other\n"}

    def make_variant(script: Path, variant: str) -> dict:
        script.write_text(script.read_text() + edits[variant])
        return {"changed": bool(edits[variant])}

    ran: list[str] = []

    def execute(entry: dict, script: Path, steps: int, timeout: int) -> dict:
        ran.append(script.read_text())
        return {"status": "fail" if "other" in script.read_text() else "pass", "error": ""}

    monkeypatch.setattr(run_scripts, "make_variant", make_variant)
    monkeypatch.setattr(run_scripts, "execute", execute)
    entry = {"name": "x", "split": "test", "repo": "owner/repo", "script": "train.py"}
    results: list[dict] = []
    run_scripts.run_all([entry], list(edits), steps=1, timeout=1, jobs=2, done=results.append)
    assert sorted(ran) == sorted(["print('train')\n" + e for e in ("", "# edit\n", "# other\n")])
    (result,) = results
    assert result["b"]["same_as"] == "a" and result["b"]["status"] == "pass"
    assert result["c"]["breaks"] and not result["b"]["breaks"]


def test_rewrite_once_starts_each_rewrite_from_the_original(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fixes reuses one scratch copy for the safe and the unsafe rewrite: each must see the
    # original, not the previous rewrite's output.
    file = tmp_path / "train.py"
    file.write_text("x = 1\n")

    def fake_rewrite(*args: str, cwd: Path | None = None):
        path = Path(args[-1])
        path.write_text(path.read_text() + f"# {' '.join(args[1:-1])}\n")
        return None

    monkeypatch.setattr(corpus_eval, "autoopt", fake_rewrite)
    safe, _ = corpus_eval.rewrite_once(file, "x = 1\n")
    unsafe, _ = corpus_eval.rewrite_once(file, "x = 1\n", "--unsafe-fixes")
    assert safe == "x = 1\n# \n"
    assert unsafe == "x = 1\n# --unsafe-fixes\n"


@pytest.mark.slow  # two subprocesses that import torch
def test_cuda_as_cpu_runs_a_script_that_calls_cuda_unconditionally(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    moved = SCRIPT.replace("opt = torch", "model.cuda()\nopt = torch")
    script.write_text(
        moved.replace("torch.randn(4, 2)", "torch.randn(4, 2).cuda(non_blocking=True)")
    )
    entry = {"script": "train.py", "cuda_as_cpu": True}
    assert run_scripts.execute(entry, script, steps=2, timeout=120)["status"] == "pass"
    # without it the same script fails where CUDA is hidden: the option is what makes it run
    outcome = run_scripts.execute({"script": "train.py"}, script, steps=2, timeout=120)
    assert outcome["status"] == "fail", outcome


@pytest.mark.slow  # one autoopt subprocess
def test_autoopt_in_process_answers_as_the_subprocess_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    args = ("lint", "--output-format", "json", "--no-cache", "--exit-zero", "-j", "1", str(script))
    here, there = corpus_eval.autoopt_here(args), corpus_eval.autoopt(*args)
    assert json.loads(here.stdout) == json.loads(there.stdout) != []
    assert here.returncode == there.returncode

    # a crash inside autoopt reads as the subprocess's would: a traceback and a failing code
    import autoopt.cli.lint

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(autoopt.cli.lint, "run_lint", crash)
    crashed = corpus_eval.autoopt_here(args)
    assert corpus_eval.has_traceback(crashed.stderr) and "boom" in crashed.stderr
    assert crashed.returncode != 0


def test_a_labelled_script_missing_on_disk_stops_the_measurement(tmp_path: Path) -> None:
    # A fetch that failed leaves an empty checkout: scoring it would count every `missing`
    # label as a miss (four splits once read recall 0.0 that way).
    labels = tmp_path / "labels.tsv"
    labels.write_text(
        "repo\tpath\trule\tlabel\tnote\n"
        "a/b\ttrain.py\tAO101\tmissing\tx\n"
        "c/d\tmain.py\tAO101\tna\tx\n"
    )
    (tmp_path / "a+b").mkdir()
    (tmp_path / "a+b" / "train.py").write_text("import torch\n")
    (tmp_path / "c+d").mkdir()
    with pytest.raises(SystemExit, match=r"1 of 2 labelled scripts.*\n  c/d/main\.py"):
        corpus_eval.accuracy(tmp_path, labels)
    with pytest.raises(SystemExit, match="c/d/main.py"):
        corpus_eval.wrap(tmp_path, labels)
    with pytest.raises(SystemExit, match="c/d/main.py"):
        corpus_eval.fixes(tmp_path, labels)


def test_a_mirror_extract_makes_the_repository_s_symlinks_inside_it(tmp_path: Path) -> None:
    # CVPR19_Incremental_Learning's `utils_incremental -> ../utils_incremental/`: written as a
    # plain file, the script's imports of that package could not be followed.
    import subprocess

    from benchmarks.corpus import fetch

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("X = 1\n")
    (repo / "app").mkdir()
    (repo / "app" / "pkg").symlink_to("../pkg/")
    (repo / "app" / "away").symlink_to("../../../etc")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    target = tmp_path / "out"
    target.mkdir()

    assert fetch.extract_from_mirror(str(repo / ".git"), commit, [], target) == 0

    assert (target / "app" / "pkg").is_symlink()
    assert (target / "app" / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert not (target / "app" / "away").exists() and not (target / "app" / "away").is_symlink()


def test_robustness_copies_a_repository_with_a_dangling_symlink(tmp_path: Path) -> None:
    # Listen-Attend-Spell links egs/aishell/steps to a Kaldi checkout that is not fetched: the
    # copy the rewrite runs on keeps the link as a link (copying it followed it and failed).
    repo = tmp_path / "a+b"
    (repo / "egs").mkdir(parents=True)
    (repo / "train.py").write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n")
    (repo / "egs" / "steps").symlink_to("../tools/kaldi/steps")
    result = corpus_eval.robustness(tmp_path, jobs=1)
    assert result["totals"]["files"] == 1
    assert result["totals"]["tracebacks"] == 0
