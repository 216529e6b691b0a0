"""The runner executes a target as ``python`` would: compared with real ``python`` subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from modtrace.core.errors import UsageError
from modtrace.recording.run_names import default_run_name, process_start_time, shared_run_name
from modtrace.recording.script_runner import Target, check_target, execute, git_commit

PROBE = textwrap.dedent(
    """
    import json, sys
    def f(x: int) -> None: ...
    print(json.dumps({
        "argv": sys.argv,
        "name": __name__,
        "file": __file__,
        "path0": sys.path[0],
        "spec_none": __spec__ is None,
        "package": __package__,
        "main_is_me": sys.modules["__main__"].__dict__ is globals(),
        "annotations": repr(f.__annotations__),
    }))
    """
)


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def in_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_script_sees_what_python_gives_it(in_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_dir / "sub").mkdir()
    (in_dir / "sub" / "probe.py").write_text(PROBE)
    expected = python("sub/probe.py", "--lr", "3", cwd=in_dir)
    assert expected.returncode == 0, expected.stderr
    argv_before, path0_before = list(sys.argv), sys.path[0]

    outcome = execute(Target("script", "sub/probe.py", ("--lr", "3")))

    got = json.loads(capsys.readouterr().out)
    assert got == json.loads(expected.stdout)
    assert got["argv"] == ["sub/probe.py", "--lr", "3"]
    assert got["annotations"] == "{'x': <class 'int'>, 'return': None}"  # no __future__ leak from modtrace
    assert (outcome.status, outcome.exit_code, outcome.error) == ("completed", 0, None)
    assert sys.argv == argv_before and sys.path[0] == path0_before


def test_symlinked_script_gets_the_real_directory_on_sys_path(in_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_dir / "real").mkdir()
    (in_dir / "real" / "probe.py").write_text(PROBE)
    (in_dir / "link.py").symlink_to(in_dir / "real" / "probe.py")
    expected = python("link.py", cwd=in_dir)
    execute(Target("script", "link.py"))
    got = json.loads(capsys.readouterr().out)
    assert got == json.loads(expected.stdout)
    assert got["path0"] == str(in_dir / "real")


def test_module_and_package_run_as_with_python_m(in_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_dir / "probe_mod.py").write_text(PROBE)
    (in_dir / "probe_pkg").mkdir()
    (in_dir / "probe_pkg" / "__init__.py").write_text("")
    (in_dir / "probe_pkg" / "__main__.py").write_text(PROBE.replace("__spec__ is None", "__spec__.name"))
    for name in ("probe_mod", "probe_pkg"):
        expected = python("-m", name, "a", "--b", cwd=in_dir)
        assert expected.returncode == 0, expected.stderr
        outcome = execute(Target("module", name, ("a", "--b")))
        got = json.loads(capsys.readouterr().out)
        want = json.loads(expected.stdout)
        assert got == want, name
        assert got["path0"] == str(in_dir) and got["name"] == "__main__"
        assert outcome.exit_code == 0
        sys.modules.pop(name, None)


def test_objects_of_the_script_pickle_as_main(in_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_dir / "pick.py").write_text(
        "import pickle\nclass Box:\n    pass\nb = pickle.loads(pickle.dumps(Box()))\nprint(type(b).__module__, type(b) is Box)\n"
    )
    execute(Target("script", "pick.py"))
    assert capsys.readouterr().out == "__main__ True\n"


def test_uncaught_exception_prints_pythons_traceback(in_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (in_dir / "fail.py").write_text("def inner():\n    raise ValueError('boom at step 3')\n\nprint('before')\ninner()\n")
    expected = python("fail.py", cwd=in_dir)
    outcome = execute(Target("script", "fail.py"))
    out, err = capfd.readouterr()
    assert (out, err) == (expected.stdout, expected.stderr)
    assert expected.returncode == outcome.exit_code == 1
    assert (outcome.status, outcome.error) == ("failed", "ValueError: boom at step 3")


def test_exception_class_of_a_library_is_named_with_its_module(in_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (in_dir / "fail.py").write_text("import json\njson.loads('{')\n")
    outcome = execute(Target("script", "fail.py"))
    assert outcome.error is not None and outcome.error.startswith("json.decoder.JSONDecodeError: Expecting")
    assert "Traceback (most recent call last):" in capfd.readouterr().err


@pytest.mark.parametrize(
    ("code", "exit_code", "status", "error"),
    [
        ("None", 0, "completed", None),
        ("0", 0, "completed", None),
        ("3", 3, "failed", "SystemExit: 3"),
        ("'bad config'", 1, "failed", "SystemExit: bad config"),
    ],
)
def test_system_exit_code_is_the_exit_code(
    in_dir: Path, capfd: pytest.CaptureFixture[str], code: str, exit_code: int, status: str, error: str | None
) -> None:
    (in_dir / "ex.py").write_text(f"import sys\nsys.exit({code})\n")
    expected = python("ex.py", cwd=in_dir)
    outcome = execute(Target("script", "ex.py"))
    _, err = capfd.readouterr()
    assert expected.returncode == outcome.exit_code == exit_code
    assert err == expected.stderr
    assert (outcome.status, outcome.error) == (status, error)


def test_keyboard_interrupt_is_interrupted_130(in_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (in_dir / "ki.py").write_text("raise KeyboardInterrupt\n")
    outcome = execute(Target("script", "ki.py"))
    assert (outcome.status, outcome.exit_code, outcome.error) == ("interrupted", 130, "KeyboardInterrupt")
    assert capfd.readouterr().err.endswith("KeyboardInterrupt\n")


def test_check_target_refuses_what_python_could_not_run(in_dir: Path) -> None:
    with pytest.raises(UsageError, match="script not found: nope.py"):
        check_target(Target("script", "nope.py"))
    with pytest.raises(UsageError, match="no module named no_such_mod_xyz"):
        check_target(Target("module", "no_such_mod_xyz"))
    with pytest.raises(UsageError, match="no module named json.nope"):
        check_target(Target("module", "json.nope"))
    (in_dir / "bare_pkg").mkdir()
    (in_dir / "bare_pkg" / "__init__.py").write_text("")
    with pytest.raises(UsageError, match="bare_pkg is a package without a __main__"):
        check_target(Target("module", "bare_pkg"))
    (in_dir / "ok.py").write_text("")
    check_target(Target("script", "ok.py"))
    check_target(Target("module", "json.tool"))


def test_target_stem() -> None:
    assert Target("script", "scripts/train_tiny.py").stem == "train_tiny"
    assert Target("module", "pkg.train").stem == "train"
    assert Target("module", "pkg.__main__").stem == "pkg"


def test_default_run_name_is_stem_and_local_time() -> None:
    assert default_run_name("train_tiny", datetime(2026, 1, 31, 14, 25, 1)) == "train_tiny-20260131-142501"


def test_shared_run_name_is_the_same_for_every_rank_of_a_launch() -> None:
    assert shared_run_name("train", {}, 1) is None
    assert shared_run_name("train", {"WORLD_SIZE": "1"}, 1) is None
    uuid_env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "3f2a9c1e-0b6d-4a8e-9f1c-2d3e4f5a6b7c"}
    assert shared_run_name("train", {**uuid_env, "RANK": "0"}, 10) == shared_run_name("train", {**uuid_env, "RANK": "1"}, 10) == "train-3f2a9c1e"
    assert shared_run_name("train", {"WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "job42"}, 1) == "train-job42"
    # Static rendezvous on one host: the launcher (common parent) names the launch.
    me = os.getpid()
    static = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}
    name = shared_run_name("train", static, me)
    assert name is not None and name.startswith("train-") and name.endswith(f"-{me}")
    # Several hosts and nothing shared: the user must name the run.
    with pytest.raises(UsageError, match="pass --run-name NAME"):
        shared_run_name("train", {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}, me)


def test_process_start_time_of_this_process_is_recent() -> None:
    started = process_start_time(os.getpid())
    assert started is not None
    assert abs((datetime.now() - started).total_seconds()) < 3600
    assert process_start_time(2**22 + 12345) is None


def test_git_commit_inside_and_outside_a_repository(tmp_path: Path) -> None:
    assert git_commit(str(tmp_path)) is None
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    assert git_commit(str(tmp_path)) is None  # no commit yet
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "-C", str(tmp_path), "add", "f"], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-q", "-m", "m"], check=True, env=env)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert git_commit(str(tmp_path)) == head.stdout.strip()
