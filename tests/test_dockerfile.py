"""The course's Dockerfile keeps the habits that make an image reproducible and cheap to rebuild: a CUDA base image
pinned by its full tag (never ``latest``), torch pinned to one version from one CUDA index, the requirements
installed before the source is copied (so editing a notebook does not reinstall everything), a non-root user, no
``ADD`` of a URL, JupyterLab on 8888, and ``make`` finding the environment; the torch/CUDA-index pair is one PyTorch
builds (``toolchain.PYTORCH_CUDA_INDEXES``), the base image has ``nvcc`` (chapter 2 compiles CUDA C), and the
project folder is created and given to the user before ``USER`` (``WORKDIR`` alone makes it root's on some
builders). Docker itself cannot run here (no daemon,
no registry), so these checks read the file; each rule is also tested on a bad Dockerfile it must reject."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction: comments dropped, backslash continuations joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def problems(text: str) -> list[str]:
    """What is wrong with a Dockerfile's text, in words; [] when it keeps every rule."""
    found = []
    steps = instructions(text)
    args = dict(re.match(r"(\w+)=?(.*)", a).groups() for k, a in steps if k == "ARG")
    froms = [a.split()[0] for k, a in steps if k == "FROM"]
    if not froms:
        return ["no FROM"]
    base = froms[-1]
    if not base.startswith("nvidia/cuda:"):
        found.append(f"the final image is not built on a CUDA base image: {base}")
    tag = base.partition(":")[2].partition("@")[0]
    if not tag or tag == "latest" or not re.match(r"\d+\.\d+\.\d+-", tag):
        found.append(f"the base image is not pinned to a full version tag: {base}")
    torch_pin = args.get("TORCH_VERSION", "")
    installs = [a for k, a in steps if k == "RUN" and "pip install" in a]
    torch_runs = [a for a in installs if re.search(r"\btorch==", a)]
    if not torch_runs or not re.fullmatch(r"\d+\.\d+\.\d+", torch_pin) and not any(
            re.search(r"torch==\d+\.\d+\.\d+", a) for a in torch_runs):
        found.append("torch is not pinned to one version (torch==X.Y.Z)")
    if torch_runs and "download.pytorch.org/whl/" not in torch_runs[0]:
        found.append("torch is not installed from the PyTorch index (the CUDA wheel)")
    order = [(k, a) for k, a in steps if k in ("COPY", "RUN")]
    copy_all = next((i for i, (k, a) in enumerate(order) if k == "COPY" and re.search(r"(^|\s)\.\s+\.$", a)), None)
    req = next((i for i, (k, a) in enumerate(order) if k == "RUN" and "-r requirements.txt" in a), None)
    if req is None or copy_all is None or req > copy_all:
        found.append("requirements are not installed before the source is copied (every edit reinstalls them)")
    users = [a for k, a in steps if k == "USER"]
    if not users or users[-1] in ("root", "0"):
        found.append("the image runs as root: add a user and USER it")
    cuda_tag = args.get("TORCH_CUDA", "")
    if cuda_tag:
        from gpuformer_lib.toolchain import PYTORCH_CUDA_INDEXES

        if cuda_tag not in PYTORCH_CUDA_INDEXES:
            found.append(f"PyTorch publishes no {cuda_tag} index: pip would find no torch there")
        elif re.fullmatch(r"\d+\.\d+\.\d+", torch_pin):
            newest = tuple(map(int, PYTORCH_CUDA_INDEXES[cuda_tag][1].split(".")))
            if tuple(map(int, torch_pin.split(".")[:2])) > newest:
                found.append(f"torch {torch_pin} is not built for {cuda_tag} (its newest torch is "
                             f"{PYTORCH_CUDA_INDEXES[cuda_tag][1]})")
    if "-devel-" not in tag:
        found.append("the base image has no nvcc (a runtime/base image): chapter 2 cannot compile its CUDA C kernel")
    user_at = max((i for i, (k, a) in enumerate(steps) if k == "USER"), default=None)
    workdirs = [(i, a) for i, (k, a) in enumerate(steps) if k == "WORKDIR"]
    if user_at is not None and workdirs:
        folder = workdirs[-1][1]
        owned = any(k == "RUN" and i < user_at and "chown" in a and folder in a for i, (k, a) in enumerate(steps))
        if not owned:
            found.append(f"WORKDIR {folder} is not created and chowned to the user before USER: on the classic "
                         "builder, Podman or kaniko it stays root's and pip install -e . cannot write there")
    if any(k == "ADD" and re.search(r"https?://", a) for k, a in steps):
        found.append("ADD of a URL: download with a checked RUN instead")
    if not any(k == "EXPOSE" and "8888" in a.split() for k, a in steps):
        found.append("JupyterLab's port 8888 is not exposed")
    return found


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def test_the_course_dockerfile_keeps_every_rule(dockerfile):
    assert problems(dockerfile) == []


def test_make_finds_the_environment_and_jupyter_is_the_command(dockerfile):
    steps = instructions(dockerfile)
    env = " ".join(a for k, a in steps if k == "ENV")
    assert "VENV=/opt/venv" in env and "PATH=/opt/venv/bin:$PATH" in env  # the Makefile's `VENV ?= .venv` yields
    assert any(k == "RUN" and "touch /opt/venv/.installed" in a for k, a in steps)  # its stamp: no reinstall
    cmd = next(a for k, a in steps if k == "CMD")
    assert "jupyter" in cmd and "--ip=0.0.0.0" in cmd and "8888" in cmd


def test_the_build_context_leaves_out_the_host_environment_and_data():
    ignored = (ROOT / ".dockerignore").read_text().split()
    for path in (".git", ".venv", "_build", "data"):
        assert path in ignored


GOOD = """FROM nvidia/cuda:12.6.3-devel-ubuntu24.04
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu126
RUN useradd learner && mkdir -p /home/learner/app && chown learner:learner /home/learner/app
WORKDIR /home/learner/app
USER learner
RUN pip install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/${TORCH_CUDA}
COPY requirements.txt ./
RUN pip install \\
    -r requirements.txt
COPY . .
EXPOSE 8888
"""


@pytest.mark.parametrize("change, words", [
    (("nvidia/cuda:12.6.3-devel-ubuntu24.04", "nvidia/cuda:latest"), "not pinned"),
    (("nvidia/cuda:12.6.3-devel-ubuntu24.04", "nvidia/cuda:12-runtime"), "not pinned"),
    (("nvidia/cuda:12.6.3-devel-ubuntu24.04", "python:3.12"), "CUDA base image"),
    (("TORCH_VERSION=2.13.0", "TORCH_VERSION=latest"), "torch is not pinned"),
    (("--index-url https://download.pytorch.org/whl/${TORCH_CUDA}", ""), "PyTorch index"),
    (("TORCH_CUDA=cu126", "TORCH_CUDA=cu122"), "publishes no cu122"),
    (("TORCH_CUDA=cu126", "TORCH_CUDA=cu124"), "not built for cu124"),
    (("12.6.3-devel-ubuntu24.04", "12.6.3-runtime-ubuntu24.04"), "no nvcc"),
    ((" && mkdir -p /home/learner/app && chown learner:learner /home/learner/app", ""), "not created and chowned"),
    (("COPY requirements.txt ./\nRUN pip install \\\n    -r requirements.txt\nCOPY . .",
      "COPY . .\nRUN pip install -r requirements.txt"), "before the source"),
    (("USER learner", "USER root"), "root"),
    (("USER learner\n", ""), "root"),
    (("EXPOSE 8888", "EXPOSE 8888\nADD https://example.org/x.tgz /x"), "ADD of a URL"),
    (("EXPOSE 8888", "EXPOSE 80"), "8888"),
])
def test_each_rule_rejects_a_dockerfile_that_breaks_it(change, words):
    assert problems(GOOD) == []
    bad = GOOD.replace(*change)
    assert bad != GOOD
    assert any(words in p for p in problems(bad)), problems(bad)
