"""Which profile fields a rehearsal reads, and which notebooks a later profile rehearses because of them.

``make rehearse`` runs every notebook under the first profile and, under each later one, only the notebooks
that read a field the two profiles set differently (gpuformer_lib/tools/rehearsal_plan.py). A recorder that
missed a read would leave a notebook's GPU path unrehearsed, so the recorder is tested here as closely as
the plan.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from gpuformer_lib import gpu, profiles
from gpuformer_lib.device import run_header
from gpuformer_lib.gpu_view import device_label
from gpuformer_lib.profiles import PROFILES, current_profile, display_only, size_preset
from gpuformer_lib.tools import rehearsal_plan

THIS_FILE = pathlib.Path(__file__).name


@pytest.fixture
def recording(tmp_path, monkeypatch):
    """Rehearse t4 with reads noted in a fresh folder; returns a function giving {field: {where}}."""
    monkeypatch.setenv(profiles.REHEARSE_ENV, "t4")
    monkeypatch.setenv(profiles.PROFILE_READS_ENV, str(tmp_path / "reads"))
    monkeypatch.delenv("GPUFORMER_PRESET", raising=False)
    monkeypatch.setattr(profiles, "_noted_reads", set())
    return lambda: rehearsal_plan.fields_read(tmp_path / "reads") or {}


def test_a_rehearsal_notes_each_field_read_once_with_where(recording):
    profile = current_profile()
    assert recording() == {}  # building the profile reads nothing on the caller's behalf
    assert profile.bf16 is False and profile.bf16 is False
    line = sys._getframe().f_lineno - 1
    assert recording() == {"bf16": {f"{THIS_FILE}:{line}"}}
    assert profile.on_gpu  # a property reads the field it is made of
    assert set(recording()) == {"bf16", "kind"}
    (record,) = (pathlib.Path(os.environ[profiles.PROFILE_READS_ENV])).glob("*.txt")
    assert record.name == f"{os.getpid()}.txt" and len(record.read_text().splitlines()) == 2


def test_text_for_the_reader_is_not_a_read_but_the_wrappers_and_choices_are(recording):
    profile = current_profile()
    run_header("cpu")
    profile.describe()
    device_label()
    with display_only():
        profile.memory_gib
    assert size_preset(profile).toy
    assert set(recording()) == {"rehearsal"}  # the preset checks `rehearsal` first: its name is display only
    assert gpu.total_memory() == int(PROFILES["t4"].memory_gib * 2**30)
    assert "memory_gib" in recording()
    assert profiles.low_precision_dtype(profile) is not None
    assert {"bf16", "fp16_tensor_cores"} <= set(recording())
    profiles.rehearsal_name()
    assert "name" in recording()


def test_a_process_the_notebook_starts_notes_its_reads_in_a_file_of_its_own(recording):
    code = "from gpuformer_lib.profiles import current_profile; current_profile().gpu_count"
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ), timeout=120)
    reads = recording()
    assert set(reads) == {"gpu_count"} and reads["gpu_count"] == {"<string>:1"}


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(profiles.REHEARSE_ENV, "t4")
    monkeypatch.delenv(profiles.PROFILE_READS_ENV, raising=False)
    monkeypatch.setattr(profiles, "_noted_reads", set())
    monkeypatch.chdir(tmp_path)
    assert current_profile().bf16 is False
    assert list(tmp_path.iterdir()) == []


def test_the_profiles_differ_where_their_data_differ():
    assert profiles.profiles_differ_on(PROFILES["h100-80gb"], PROFILES["8xh100"]) == {"gpu_count", "name"}
    t4_h100 = profiles.profiles_differ_on(PROFILES["t4"], PROFILES["h100-80gb"])
    assert {"bf16", "tf32", "sdpa_kernels", "memory_gib", "compute_capability"} <= t4_h100
    assert not t4_h100 & {"kind", "gpu_count", "fp16_tensor_cores", "rehearsal"}


def _record(reads, profile, notebook, *fields):
    folder = reads / profile / pathlib.Path(notebook).stem
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "1.txt").write_text("".join(f"{f}\tcell.py:{i}\n" for i, f in enumerate(fields)))


BOOKS = ["notebooks/01_a.ipynb", "notebooks/02_b.ipynb", "notebooks/03_c.ipynb", "notebooks/04_d.ipynb"]


def test_the_first_profile_rehearses_every_notebook(tmp_path):
    run, why = rehearsal_plan.plan(tmp_path, "t4", BOOKS)
    assert run == BOOKS and all("no earlier record" in line for line in why)


def test_a_later_profile_rehearses_only_the_notebooks_whose_reads_differ(tmp_path):
    _record(tmp_path, "t4", BOOKS[0], "kind", "rehearsal")  # same path on an H100
    _record(tmp_path, "t4", BOOKS[1], "kind", "bf16")  # bf16: fp16 on a T4, bf16 on an H100
    _record(tmp_path, "t4", BOOKS[2], "gpu_count")  # one GPU on both
    # BOOKS[3]: no record (a notebook added after the first rehearsal, or a recorder that failed): rehearsed
    run, why = rehearsal_plan.plan(tmp_path, "h100-80gb", BOOKS)
    assert run == [BOOKS[1], BOOKS[3]]
    assert why[0].startswith("left out: notebooks/01_a.ipynb")
    assert why[1] == "rehearsed: notebooks/02_b.ipynb: under t4 it read bf16 (cell.py:1)"
    assert why[3].startswith("rehearsed: notebooks/04_d.ipynb") and "no earlier record" in why[3]


def test_a_notebook_is_left_out_when_any_earlier_profile_took_its_path(tmp_path):
    _record(tmp_path, "t4", BOOKS[0], "kind", "bf16")
    _record(tmp_path, "h100-80gb", BOOKS[0], "kind", "bf16")  # bf16 on an H100 is bf16 on 8 of them
    _record(tmp_path, "t4", BOOKS[1], "kind", "gpu_count")  # data parallel: 8 ranks on 8 GPUs
    _record(tmp_path, "t4", BOOKS[2], "kind", "bf16")  # never rehearsed under h100: t4 alone does not cover 8xh100
    run, why = rehearsal_plan.plan(tmp_path, "8xh100", BOOKS[:3])
    assert run == BOOKS[1:3]
    assert why[0].startswith("left out: notebooks/01_a.ipynb: under h100-80gb")
    assert "gpu_count" in why[1] and "bf16" in why[2]


def test_the_command_prints_the_plan(tmp_path, capsys):
    _record(tmp_path, "t4", BOOKS[0], "kind")
    _record(tmp_path, "t4", BOOKS[1], "bf16")
    assert rehearsal_plan.main([str(tmp_path), "--profile", "h100-80gb", *BOOKS[:2]]) == 0
    out, err = capsys.readouterr()
    assert out.split() == [BOOKS[1]] and "(1 of 2)" in err
    with pytest.raises(SystemExit):
        rehearsal_plan.main([str(tmp_path), "--profile", "a100", *BOOKS])
    assert "not a profile" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rehearsal_plan.main([str(tmp_path / "missing"), "--profile", "t4", *BOOKS])


def test_the_library_and_notebooks_learn_of_a_rehearsal_only_through_the_profiles_module():
    """A choice made from $GPUFORMER_REHEARSE itself would escape the recorder."""
    reads_env = re.compile(r"""(os\.environ(\.get)?\s*[\[(]|os\.getenv\()\s*(REHEARSE_ENV|\\?["']GPUFORMER_REHEARSE)""")
    root = pathlib.Path(profiles.__file__).parent
    files = [*root.rglob("*.py"), *(root.parent / "notebooks").glob("*.ipynb")]
    readers = {str(path.relative_to(root.parent)) for path in files if reads_env.search(path.read_text())}
    # execute.py reads it only to refuse storing a rehearsal's outputs
    assert readers == {"gpuformer_lib/profiles.py", "gpuformer_lib/tools/execute.py"}, readers


def test_a_notebook_left_out_by_request_says_so_and_what_it_read(tmp_path, capsys):
    _record(tmp_path, "t4", BOOKS[0], "kind", "gpu_count")
    _record(tmp_path, "t4", BOOKS[1], "kind", "gpu_count")
    run, why = rehearsal_plan.plan(tmp_path, "8xh100", BOOKS[:2], {BOOKS[0]: "a test runs its 8 ranks"})
    assert run == [BOOKS[1]]
    assert why[0] == ("LEFT OUT BY REQUEST: notebooks/01_a.ipynb: a test runs its 8 ranks (under t4 it read "
                      "gpu_count (cell.py:1))")
    with pytest.raises(ValueError, match="not a notebook to plan"):
        rehearsal_plan.plan(tmp_path, "8xh100", BOOKS[:1], {"notebooks/99_x.ipynb": "why"})
    # on the command line, PROFILE:NOTEBOOK:WHY applies to that profile only
    spec = f"8xh100:{BOOKS[0]}:a test runs its 8 ranks"
    assert rehearsal_plan.main([str(tmp_path), "--profile", "8xh100", "--leave-out", spec, *BOOKS[:2]]) == 0
    assert capsys.readouterr().out.split() == [BOOKS[1]]
    assert rehearsal_plan.main([str(tmp_path), "--profile", "h100-80gb", "--leave-out", spec, *BOOKS[:2]]) == 0
    assert capsys.readouterr().out.split() == []  # one GPU on both: nothing differs, nothing left out by request
    with pytest.raises(SystemExit):
        rehearsal_plan.main([str(tmp_path), "--profile", "8xh100", "--leave-out", "8xh100:only-two", *BOOKS[:2]])
