"""Which cells of a submitted notebook a person must read before trusting its grade: ``make grade``'s ``flags``.

The learner's code runs in the same process as the checks, so code that sets out to can forge a pass
(:mod:`gpuformer_lib.exercises._core`), and code below Python, or a Python child started without the sandbox's
hook, gets past the audit hook (:mod:`gpuformer_lib.tools.sandbox`). :func:`suspicious` names every code cell that
takes one of the routes known to do either:

* the grading channel's internals: ``_record``, ``_report``, ``_safe_check``, the log (``GPUFORMER_GRADE_LOG``,
  ``GRADE_LOG_ENV``, a path ending in ``checks.jsonl``);
* code that hides what it runs: ``exec``, ``eval``, ``compile`` (the built-ins, not ``torch.compile``), a
  function's ``__code__``, ``__closure__`` or ``__globals__``, ``ctypes`` or ``cffi``, an audit hook;
* an assignment to, ``setattr`` or ``delattr`` on, an attribute of a ``gpuformer_lib.exercises`` module, and a
  private name of one (``from gpuformer_lib.exercises.proteins import _reference_mcc``: a check's own answer);
* a Python child without the sandbox's hook: ``python -S``, ``-I`` or ``-E`` (``[sys.executable, "-S", ...]``, or
  in a command string), a child started with an ``env=`` that is not ``os.environ`` plus changes that leave
  ``PYTHONPATH`` alone, or a change to ``PYTHONPATH`` itself (the hook comes in through it);
* the programs and C library calls that change mounts or namespaces: ``mount``, ``umount``, ``unshare``,
  ``nsenter``, ``chroot``, ``pivot_root`` (and the C library's ``umount2`` and ``setns``).

**Only code counts.** A cell is read with :mod:`ast`, so comments never count, and a string only where code uses
it as a name, a path or a program: a string that *is* one of the names above (``os.environ["GPUFORMER_GRADE_LOG"]``,
``__import__("ctypes")``; ``exec``, ``eval`` and ``compile`` only as ``getattr``'s argument or a subscript), a
path ending in ``checks.jsonl``, and, for programs and Python's options, the strings handed to a call that starts a
process (``subprocess.run``, ``Popen``, ``os.system``, ``os.exec*``, ...) or held in a list or tuple that starts
with a program or holds ``sys.executable`` (an argv built beforehand). The code a Python child is given with
``-c`` (a string, or a name assigned one in the cell) is read as code too. So ``print("I did not use ctypes")`` and
``# no eval( here`` are not flagged. IPython's ``!shell`` and ``%magic`` lines, a ``%%`` cell magic's cell and a
cell that does not parse are read as text (comments removed where the tokenizer can).

Leaves out what is computed (``"ex" + "ec"``, ``getattr(builtins, name)``): a heuristic finds the routes known to
forge a pass or escape, not every route; the sandbox, and a person reading the flagged cells, do the rest.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

CHANNEL_NAMES = {"_record": "_record", "_report": "_report", "_safe_check": "_safe_check",
                 "GRADE_LOG_ENV": "the grading log", "GPUFORMER_GRADE_LOG": "the grading log"}
HIDING_BUILTINS = ("compile", "exec", "eval")
INTERNALS = ("__code__", "__closure__", "__globals__")
BELOW_PYTHON = ("ctypes", "_ctypes", "cffi")
NAMESPACE_PROGRAMS = ("mount", "umount", "umount2", "unshare", "nsenter", "chroot", "pivot_root", "setns")
PROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput", "system",
                 "popen", "execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe", "spawnv",
                 "spawnve", "spawnvp", "spawnvpe", "spawnl", "spawnle", "spawnlp", "spawnlpe", "posix_spawn",
                 "posix_spawnp", "create_subprocess_exec", "create_subprocess_shell", "spawn", "startfile"}
PROCESS_MODULES = ("subprocess", "os", "asyncio", "pty")
NAME_USING_CALLS = {"getattr", "setattr", "delattr", "hasattr", "__import__", "import_module", "find_spec"}
ORDER = ["_record", "_report", "_safe_check", "the grading log", "compile(", "exec(", "eval(",
         "a function's internals", "ctypes", "audit hooks"]
"""The labels in the order a flag lists them (the others follow, in the order found)."""

_PYTHON = re.compile(r"python[\d.]*$")
_TOKENS = re.compile(r"[\s;&|()`'\"<>!]+")
_TEXT_PATTERNS = [(re.compile(pattern), what) for pattern, what in (
    (r"\b_record\b", "_record"), (r"\b_report\b", "_report"), (r"\b_safe_check\b", "_safe_check"),
    (r"GPUFORMER_GRADE_LOG|\bGRADE_LOG_ENV\b|checks\.jsonl", "the grading log"),
    (r"(?<![\w.])compile\s*\(", "compile("), (r"(?<![\w.])exec\s*\(", "exec("), (r"(?<![\w.])eval\s*\(", "eval("),
    (r"__code__|__closure__|__globals__", "a function's internals"), (r"\bctypes\b|\bcffi\b", "ctypes"),
    (r"addaudithook|sys\.audit\b", "audit hooks"), (r"\bPYTHONPATH\b", "changes PYTHONPATH (the sandbox's hook)"))]


def suspicious(cells: list[str | None]) -> list[str]:
    """``code cell N: what, what`` for each code cell to read by hand (see the module docstring). ``cells`` holds
    the notebook's cells in order: a code cell's source, ``None`` for a markdown or raw cell (not counted, so that
    ``N`` counts code cells only, as a learner numbers them)."""
    code = [source for source in cells if source is not None]
    aliases, process_names = _notebook_names(code)
    found = []
    for number, source in enumerate(code, start=1):
        if not source.strip():
            continue
        what = _cell_flags(source, aliases, process_names)
        if what:
            found.append(f"code cell {number}: {', '.join(what)}")
    return found


def _notebook_names(cells: list[str]) -> tuple[set[str], set[str]]:
    """Names any cell binds to ``gpuformer_lib`` or a module of ``gpuformer_lib.exercises``, and names imported
    from a module that starts processes (``from subprocess import run``)."""
    aliases, process_names = {"gpuformer_lib"}, set()
    for source in cells:
        tree = _parse(source)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Import):
                aliases |= {(a.asname or a.name).split(".")[0] for a in node.names
                            if a.name.startswith("gpuformer_lib")}
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if module.startswith("gpuformer_lib"):
                    aliases |= {a.asname or a.name for a in node.names
                                if module.startswith("gpuformer_lib.exercises") or a.name == "exercises"}
                if module.split(".")[0] in PROCESS_MODULES:
                    process_names |= {a.asname or a.name for a in node.names if a.name in PROCESS_CALLS}
    return aliases, process_names


def _parse(source: str) -> ast.AST | None:
    if source.lstrip().startswith("%%"):
        return None  # a cell magic: the cell is not Python
    try:
        return ast.parse(_without_magics(source))
    except (SyntaxError, ValueError):
        return None


def _without_magics(source: str) -> str:
    """Python source with IPython's ``%magic`` and ``!shell`` lines blanked, so that ``ast`` can parse it."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _magic_lines(source: str) -> str:
    if source.lstrip().startswith("%%"):
        return source
    return "\n".join(line for line in source.splitlines() if line.lstrip().startswith(("%", "!")))


def _cell_flags(source: str, aliases: set[str], process_names: set[str]) -> list[str]:
    tree = _parse(source)
    found: list[str] = []
    if tree is None:
        found += _text_flags(_without_comments(source))
    else:
        _CodeReader(found, aliases, process_names).read(tree)
        found += _text_flags(_magic_lines(source))
    known = [label for label in ORDER if label in found]
    return known + [label for label in dict.fromkeys(found) if label not in ORDER]


def _without_comments(source: str) -> str:
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type != tokenize.COMMENT]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source


def _text_flags(text: str) -> list[str]:
    """Flags of what is not Python (a shell line, a magic, a cell that does not parse), read as text."""
    if not text.strip():
        return []
    found = [label for pattern, label in _TEXT_PATTERNS if pattern.search(text)]
    return found + _command_flags(text)


def _command_flags(command: str) -> list[str]:
    """Flags of a command line or argv element: a namespace program, or a Python started without the hook."""
    found = []
    tokens = [t for t in _TOKENS.split(command) if t]
    for index, token in enumerate(tokens):
        base = token.rsplit("/", 1)[-1]
        if base in NAMESPACE_PROGRAMS:
            found.append(f"starting the program {base}")
        elif _PYTHON.match(base):
            found += _python_options(tokens[index + 1:])
    return found


def _python_options(after: list) -> list[str]:
    """``a Python child without the sandbox's hook (-S)`` for each of ``-S``, ``-I``, ``-E`` among the options that
    follow a Python executable (``-IS`` and ``-Sc`` included)."""
    letters = []
    for token in after:
        if not isinstance(token, str) or not token.startswith("-") or token.startswith("--") or token == "-":
            break
        for letter in token[1:]:
            if letter in "SIE":
                letters.append(f"-{letter}")
            if letter in "cmWX":  # the rest of the token is that option's argument
                break
        if token[1:2] in ("c", "m"):
            break
    return [f"a Python child without the sandbox's hook ({', '.join(dict.fromkeys(letters))})"] if letters else []


class _CodeReader:
    """Walks one cell's syntax tree and appends the labels of what it finds to ``found``."""

    def __init__(self, found: list[str], aliases: set[str], process_names: set[str], depth: int = 0):
        self.found, self.aliases, self.process_names, self.depth = found, aliases, process_names, depth
        self.strings: dict[str, str] = {}  # names the cell assigns a string to (the code of a `python -c`)

    def read(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and _string(node.value) is not None):
                self.strings[node.targets[0].id] = _string(node.value)
        for node in ast.walk(tree):
            self.node(node)

    def add(self, label: str) -> None:
        self.found.append(label)

    def name(self, name: str) -> None:
        """A name the code uses (a variable, an attribute, an import)."""
        if name in CHANNEL_NAMES:
            self.add(CHANNEL_NAMES[name])
        elif name in INTERNALS:
            self.add("a function's internals")
        elif name in BELOW_PYTHON:
            self.add("ctypes")
        elif name == "addaudithook":
            self.add("audit hooks")

    def node(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            self.name(node.id)
            if node.id in HIDING_BUILTINS:
                self.add(f"{node.id}(")
        elif isinstance(node, ast.Attribute):
            self.name(node.attr)
            root = node.value
            if _private(node.attr) and (_root(node) in self.aliases - {"gpuformer_lib"}
                                        or "exercises" in ast.unparse(root).split(".")):
                self.add(f"a check's private {node.attr}")
            if node.attr == "audit" and isinstance(root, ast.Name) and root.id == "sys":
                self.add("audit hooks")
            if node.attr in HIDING_BUILTINS and isinstance(root, ast.Name) and root.id in ("builtins", "__builtins__"):
                self.add(f"{node.attr}(")
        elif isinstance(node, ast.alias):
            for part in node.name.split("."):
                self.name(part)
        elif isinstance(node, ast.ImportFrom):
            for part in (node.module or "").split("."):
                self.name(part)
            if (node.module or "").startswith("gpuformer_lib.exercises"):
                for alias in node.names:
                    if _private(alias.name):
                        self.add(f"a check's private {alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            if text in CHANNEL_NAMES or text in INTERNALS or text in BELOW_PYTHON or text == "addaudithook":
                self.name(text)
            if text.endswith("checks.jsonl") or re.search(r"\$\{?GPUFORMER_GRADE_LOG\b", text):
                self.add("the grading log")
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, (ast.List, ast.Tuple)):
            self.argv(node.elts)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            self.assignment(node)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if _string(node.slice) in HIDING_BUILTINS:
                self.add(f"{_string(node.slice)}(")

    def call(self, node: ast.Call) -> None:
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if called in NAME_USING_CALLS:
            for arg in node.args:
                if _string(arg) in HIDING_BUILTINS:
                    self.add(f"{_string(arg)}(")
                elif _string(arg) in NAMESPACE_PROGRAMS:
                    self.add(f"calling {_string(arg)}()")
        if called in ("setattr", "delattr") and isinstance(func, ast.Name) and node.args:
            if _root(node.args[0]) in self.aliases:
                self.add(f"{called} on {ast.unparse(node.args[0])}")
        if called in NAMESPACE_PROGRAMS:
            self.add(f"calling {called}()")
        if (isinstance(func, ast.Attribute) and called in ("pop", "unsetenv", "putenv", "__delitem__", "__setitem__")
                and node.args and _string(node.args[0]) == "PYTHONPATH"):
            self.add("changes PYTHONPATH (the sandbox's hook)")
        if isinstance(func, ast.Attribute) and called == "clear" and _is_environ(func.value):
            self.add("changes PYTHONPATH (the sandbox's hook)")
        starts_process = (isinstance(func, ast.Attribute) and called in PROCESS_CALLS
                          or isinstance(func, ast.Name) and called in self.process_names)
        if not starts_process:
            return
        arguments = [*node.args, *(k.value for k in node.keywords if k.arg in ("args", "executable"))]
        flat = []
        for arg in arguments:
            flat += arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
        self.argv(flat, started=True)
        for keyword in node.keywords:
            if keyword.arg == "env" and not _keeps_pythonpath(keyword.value):
                self.add("a child process with its own env= (without the sandbox's PYTHONPATH)")

    def argv(self, elements: list[ast.AST], started: bool = False) -> None:
        """An argv: the arguments of a call that starts a process (``started``), or a list or tuple literal,
        which counts when it starts with a program named above or holds ``sys.executable`` or a Python."""
        strings = [_string(e) for e in elements]
        python = [i for i, e in enumerate(elements) if _is_executable(e)
                  or strings[i] is not None and _PYTHON.match(strings[i].strip().rsplit("/", 1)[-1] or "x")]
        first = (strings[0] or "").strip().rsplit("/", 1)[-1] if elements else ""
        if not (started or python or first in NAMESPACE_PROGRAMS):
            return
        for text in strings:
            if text is not None:
                self.found += [f for f in _command_flags(text) if not f.startswith("a Python child")]
        for at in python:
            rest = strings[at + 1:]
            self.found += _python_options(rest)
            self.child_code(elements[at + 1:], rest)
        if started and not python:  # a command string: `python -S -c ...` inside it
            for text in strings:
                if text is not None:
                    self.found += [f for f in _command_flags(text) if f.startswith("a Python child")]

    def child_code(self, elements: list[ast.AST], strings: list[str | None]) -> None:
        """Read the code a Python child is given with ``-c`` as code of this cell."""
        for index, text in enumerate(strings[:-1]):
            if text is None or not text.startswith("-") or text.startswith("--"):
                return
            if text.endswith("c"):
                code = strings[index + 1]
                following = elements[index + 1]
                if code is None and isinstance(following, ast.Name):
                    code = self.strings.get(following.id)
                if code is not None and self.depth < 3:
                    tree = _parse(code)
                    if tree is not None:
                        _CodeReader(self.found, self.aliases, self.process_names, self.depth + 1).read(tree)
                return

    def assignment(self, node: ast.AST) -> None:
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target])
        for target in targets:
            if (isinstance(target, ast.Subscript) and _string(target.slice) == "PYTHONPATH"
                    and _is_environ(target.value)):
                self.add("changes PYTHONPATH (the sandbox's hook)")
            if isinstance(node, ast.Delete):
                continue
            if isinstance(target, ast.Attribute) and _root(target) in self.aliases:
                self.add(f"assigns to {ast.unparse(target)}")


def _private(name: str) -> bool:
    """A private name of a module (``_reference_mcc``), which a check keeps to itself: not a dunder, and not one
    of the grading channel's names, which have flags of their own."""
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and name not in CHANNEL_NAMES)


def _string(node: ast.AST) -> str | None:
    """The value of a string constant (an f-string's constant parts joined), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return None


def _root(node: ast.AST) -> str | None:
    """``predictions`` for ``predictions._report`` or ``predictions.x.y``: the name an attribute chain starts at."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_executable(node: ast.AST) -> bool:
    """``sys.executable`` (or a name imported as ``executable``)."""
    return (isinstance(node, ast.Attribute) and node.attr == "executable"
            or isinstance(node, ast.Name) and node.id == "executable")


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            or isinstance(node, ast.Name) and node.id == "environ")


def _keeps_pythonpath(node: ast.AST) -> bool:
    """Whether an ``env=`` is ``os.environ`` (or its copy, or a dict of it plus other variables) without a new
    ``PYTHONPATH``: a child started with it still loads the sandbox's hook."""
    if _is_environ(node) or isinstance(node, ast.Constant) and node.value is None:  # None: the parent's
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "copy":
        return _is_environ(node.func.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return (bool(node.args) and _keeps_pythonpath(node.args[0])
                and all(k.arg != "PYTHONPATH" and (k.arg is not None or _keeps_pythonpath(k.value))
                        for k in node.keywords))
    if isinstance(node, ast.Dict):
        spread = [v for k, v in zip(node.keys, node.values) if k is None]
        return (any(_keeps_pythonpath(v) for v in spread)
                and all(_string(k) != "PYTHONPATH" for k in node.keys if k is not None))
    return False
