"""``make outputs`` (tools.execute) and ``make student`` (tools.student) on small notebooks."""

import nbformat
import pytest
from nbclient.exceptions import CellExecutionError
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from gpuformer_lib.tools import execute, student
from gpuformer_lib.tools.notebooks import METADATA_KEY, code_hash


def write(path, *cells):
    nb = new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_execute_runs_in_place_and_records_metadata(tmp_path):
    path = write(tmp_path / "ok.ipynb", new_markdown_cell("# hi"), new_code_cell("print(6 * 7)"))
    path.chmod(0o644)
    seconds = execute.execute_notebook(path, timeout=120)
    assert path.stat().st_mode & 0o777 == 0o644  # readable by others, as before
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[1].outputs[0]["text"] == "42\n"
    meta = nb.metadata[METADATA_KEY]
    assert meta["code_hash"] == code_hash(nb)
    assert meta["hardware"]["device"] and meta["versions"]["torch"] and meta["preset"]
    assert 0 < seconds and meta["seconds"] == round(seconds, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["ok.ipynb"]  # no temporary file left behind


def test_execute_leaves_a_failing_notebook_unchanged(tmp_path):
    path = write(tmp_path / "bad.ipynb", new_code_cell("raise ValueError('boom')"))
    before = path.read_bytes()
    with pytest.raises(CellExecutionError, match="boom"):
        execute.execute_notebook(path, timeout=120)
    assert path.read_bytes() == before
    assert execute.main([str(path)]) == 1


def test_student_copy_drops_solutions_and_outputs(tmp_path):
    solution = new_code_cell("answer = 42")
    solution.metadata["tags"] = ["hide-cell", "solution"]
    exercise = new_code_cell("answer = None")
    exercise.outputs = [nbformat.v4.new_output("stream", name="stdout", text="x\n")]
    exercise.execution_count = 3
    nb = new_notebook(cells=[new_markdown_cell("Exercise"), exercise, solution])
    nb.metadata[METADATA_KEY] = {"code_hash": "x"}
    copy = student.student_copy(nb)
    assert [c.source for c in copy.cells] == ["Exercise", "answer = None"]
    assert copy.cells[1].outputs == [] and copy.cells[1].execution_count is None
    assert METADATA_KEY not in copy.metadata
    assert len(nb.cells) == 3  # the original is untouched


def test_outputs_for_a_device_that_is_not_here_fail_at_once(tmp_path, capsys, monkeypatch):
    """Finding B18: `make outputs DEVICE=cuda` on a machine whose torch cannot see a GPU must not store CPU outputs."""
    monkeypatch.delenv("GPUFORMER_REHEARSE", raising=False)
    path = write(tmp_path / "ok.ipynb", new_code_cell("print(1)"))
    before = path.read_text()
    with pytest.raises(SystemExit) as exit_info:
        execute.main(["--device", "cuda", str(path)])
    assert exit_info.value.code == 2 and "CUDA was requested" in capsys.readouterr().err
    assert path.read_text() == before


def test_outputs_are_refused_under_a_rehearsal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUFORMER_REHEARSE", "t4")
    path = write(tmp_path / "ok.ipynb", new_code_cell("print(1)"))
    with pytest.raises(SystemExit):
        execute.main([str(path)])
    assert "must not become the book's stored outputs" in capsys.readouterr().err


def test_make_student_writes_copies_of_the_course_and_refuses_the_course_folder(tmp_path):
    """`make student` (into a new folder) keeps working; the course's own folder is refused as an output."""
    from gpuformer_lib.tools.notebooks import REPO_ROOT, notebook_paths

    out = tmp_path / "student"
    assert student.main([str(out)]) == 0
    copies = sorted(out.glob("*.ipynb"))
    assert [p.name for p in copies] == [p.name for p in notebook_paths()]
    for path in copies:
        nb = nbformat.read(path, as_version=4)
        assert not any("solution" in c.metadata.get("tags", []) for c in nb.cells)
        assert nb.metadata[student.STUDENT_KEY]["cells_sha256"] == student.cells_hash(nb)
    assert student.main([str(out)]) == 0  # its own unedited copies are replaced
    for folder in (REPO_ROOT / "notebooks", REPO_ROOT / "notebooks" / ".." / "notebooks"):
        with pytest.raises(student.OverwriteRefused, match="would overwrite the notebook"):
            student.check_outputs(folder, notebook_paths())
