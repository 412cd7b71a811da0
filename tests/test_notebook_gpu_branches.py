"""No untested branch in a notebook (STYLE habit 13): a GPU branch holds a call into the library and a print.

The GPU branches of the notebooks run in CI only under a rehearsed profile, at toy sizes; logic there
would be tested by nothing else. So, in every notebook's code:
- an ``if`` whose condition asks about the device (``on_gpu``, ``profile``, ``device.type``, ``cuda``) holds
  only calls, assignments of a call's result or of a plain value, and loops of those (printing rows), in
  both branches;
- no ``torch.cuda.*`` call (the CUDA-only calls live in ``gpuformer_lib.gpu``, which has stand-ins);
- no tensor is created with ``device="cuda"`` (use the device the notebook chose: the CPU in rehearsal).
"""

import ast
import json
import re

import pytest

from gpuformer_lib.tools.notebooks import notebook_paths

NOTEBOOKS = notebook_paths()
DEVICE_TEST = re.compile(r"on_gpu|profile\b|profile\.|device\.type|cuda")
PLAIN = (ast.Constant, ast.Name, ast.Attribute, ast.Call, ast.JoinedStr)


def code_cells(path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code":
            source = "".join(cell["source"])
            # IPython magics and shell escapes are not Python
            lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
            yield index, "\n".join(lines)


def _plain_value(node) -> bool:
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_plain_value(e) for e in node.elts)
    if isinstance(node, (ast.ListComp, ast.DictComp)):  # one library call per item, no filtering
        item = node.elt if isinstance(node, ast.ListComp) else node.value
        return isinstance(item, ast.Call) and not any(g.ifs for g in node.generators)
    if isinstance(node, ast.IfExp):  # choosing words or a value
        return _plain_value(node.body) and _plain_value(node.orelse)
    if isinstance(node, ast.BinOp) and any(_is_text(side) for side in (node.left, node.right)):
        return _plain_value(node.left) and _plain_value(node.right)  # building a sentence
    return isinstance(node, PLAIN)


def _is_text(node) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _simple(statement) -> bool:
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, (ast.Call, ast.Constant))
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        return statement.value is not None and _plain_value(statement.value)
    if isinstance(statement, ast.Pass):
        return True
    if isinstance(statement, ast.For):  # e.g. printing the rows a library call returned
        return not statement.orelse and all(_simple(s) for s in statement.body)
    return False


NOT_REHEARSING = re.compile(r"not (\w+\.rehearsal|getattr\(\w+, 'rehearsal', False\))")
"""The test of an ``if`` whose body runs in every run but a rehearsal: CI's own CPU run among them, so its body
is tested like any other cell's (chapter 14 checks its L2 grid's optimum there, not at a rehearsal's toy sizes)."""


def branch_problems(source: str) -> list[str]:
    """Lines of device-dependent ``if`` statements that hold more than calls and plain assignments."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.If, ast.IfExp)) and DEVICE_TEST.search(ast.unparse(node.test)):
            if isinstance(node, ast.IfExp):
                continue  # an expression: chooses a value, holds no statements
            if NOT_REHEARSING.fullmatch(ast.unparse(node.test)) and not node.orelse:
                continue
            for statement in node.body + node.orelse:
                if isinstance(statement, ast.If) and statement in node.orelse:
                    continue  # an elif: checked as an if of its own
                if not _simple(statement):
                    problems.append(f"line {statement.lineno}: {ast.unparse(statement).splitlines()[0][:90]}")
    return problems


def test_the_rule_itself_catches_logic_in_a_gpu_branch():
    bad = "if on_gpu:\n    limit = gpu.memory_allocated(device) + 3\n    for x in y:\n        z = x * 2\n"
    good = ("if on_gpu:\n    peak = memory.measure_peak_memory(step, device)\n    print(peak)\n"
            "else:\n    peak = None\n")
    assert len(branch_problems(bad)) == 2 and branch_problems(good) == []
    # a check that every run but a rehearsal makes is tested by CI's CPU run; one only a rehearsal (or a GPU)
    # makes, or an else beside it, is not
    assert branch_problems("if not profile.rehearsal:\n    assert a < b\n") == []
    assert len(branch_problems("if profile.rehearsal:\n    assert a < b\n")) == 1
    assert len(branch_problems("if not profile.rehearsal:\n    pass\nelse:\n    assert a < b\n")) == 1
    assert len(branch_problems("if not on_gpu or profile.rehearsal:\n    assert a < b\n")) == 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_gpu_branches_only_call_the_library(path):
    problems = [f"cell {i}, {p}" for i, source in code_cells(path) for p in branch_problems(source)]
    assert not problems, (f"{path.name}: a device-dependent branch holds logic that only a GPU would run; move it "
                          "into a tested library function:\n" + "\n".join(problems))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_no_bare_cuda_calls_or_cuda_literals(path):
    problems = []
    for index, source in code_cells(path):
        for node in ast.walk(ast.parse(source)):
            text = ast.unparse(node) if isinstance(node, (ast.Attribute, ast.keyword)) else ""
            if isinstance(node, ast.Attribute) and text.startswith("torch.cuda.") and text.count(".") >= 2:
                problems.append(f"cell {index}: {text} (use gpuformer_lib.gpu)")
            if isinstance(node, ast.keyword) and node.arg == "device" and isinstance(node.value, ast.Constant) \
                    and str(node.value.value).startswith("cuda"):
                problems.append(f"cell {index}: device={node.value.value!r} (use the notebook's device)")
    # torch.cuda.is_available() and device_count() report the machine, as chapter 0 teaches: allowed
    problems = [p for p in problems if "is_available" not in p and "device_count" not in p
                and "get_device_name" not in p]
    assert not problems, f"{path.name}:\n" + "\n".join(sorted(set(problems)))
