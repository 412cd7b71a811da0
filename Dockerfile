# The course in a container: a CUDA base image, a Python virtual environment, a CUDA build of PyTorch pinned to
# one version, the course's requirements, JupyterLab on port 8888, and `make test` runnable inside.
#
#   docker build -t gpuformer .                          # needs a registry (Docker Hub) and the PyTorch index
#   docker build --build-arg UID=$(id -u) -t gpuformer . # if your uid is not 1000 (for writable mounted folders)
#   docker run --gpus all -p 8888:8888 gpuformer         # JupyterLab; open the printed http://127.0.0.1:8888 URL
#   docker run --gpus all gpuformer make test            # the course's tests, inside the container
#   docker run --gpus all gpuformer make gpu-check       # the GPU checks (chapter 0), on a GPU
#   add -v /path/to/data:/home/learner/gpuformer/data to use data sets you already have (else they download)
#
# The host carries only the NVIDIA driver and the NVIDIA Container Toolkit (`--gpus all`). The driver must support
# the CUDA version of the wheel, 12.6 here (nvidia-smi prints the newest it supports). Chapter 16 explains each layer.

# The base image, pinned by its full tag (CUDA 12.6.3, Ubuntu 24.04), never `latest`: a rebuild next year gets the
# same system. "devel", not "runtime": it carries nvcc, which chapter 2 needs to compile its CUDA C kernel
# (torch.utils.cpp_extension finds it through CUDA_HOME). No "cudnn" variant: the torch wheel brings cuDNN, cuBLAS
# and NCCL as nvidia-* pip packages, so a system copy would only duplicate them. For a byte-identical base, append
# its digest: FROM nvidia/cuda:<tag>@sha256:<digest>.
FROM nvidia/cuda:12.6.3-devel-ubuntu24.04

# One PyTorch version from one CUDA index, a pair PyTorch builds (its release compatibility matrix: torch 2.13 is
# built for cu126 and cu130). cu126 ships kernels for Maxwell to Hopper (a T4 and an H100 included) and runs on any
# driver that supports CUDA 12.6; for Blackwell GPUs use TORCH_CUDA=cu130 (a driver for CUDA 13.0) and a
# 13.0 base image. gpuformer_lib.toolchain.PYTORCH_CUDA_INDEXES lists the tags that exist.
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu126
# The learner's uid: 1000 is the first user's on most Linux hosts, so folders mounted with -v stay writable.
ARG UID=1000

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CUDA_HOME=/usr/local/cuda \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    VENV=/opt/venv

# Python with venv, a C++ compiler (torch.compile's CPU backend; nvcc's host compiler for chapter 2), make, git.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ make git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# A non-root user owns the environment and the project folder. Ubuntu 24.04 images already have a user "ubuntu"
# with uid 1000: remove it so that the learner gets the uid. The project folder is created and handed to the
# learner here, as root, because WORKDIR creates a missing folder as root on some builders (the classic builder,
# Podman/Buildah, kaniko), and then pip install -e . and make test could not write in it.
RUN (userdel --remove ubuntu 2>/dev/null || true) \
    && useradd --create-home --shell /bin/bash --uid "${UID}" learner \
    && mkdir -p /home/learner/gpuformer \
    && chown learner:learner /home/learner/gpuformer \
    && python3 -m venv /opt/venv \
    && chown -R learner:learner /opt/venv
WORKDIR /home/learner/gpuformer
USER learner

# Dependencies before the code: this layer is rebuilt only when requirements.txt or the torch pin changes, not on
# every edit of a notebook. torch comes first from the CUDA index (requirements.txt leaves an installed torch alone).
RUN pip install "torch==${TORCH_VERSION}" --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}"
COPY --chown=learner:learner requirements.txt ./
RUN pip install -r requirements.txt \
    && pip freeze > /opt/venv/installed-versions.txt

# The course itself, installed in editable mode so notebooks import the library from the copied source. The
# Makefile's commands use $VENV (set above) and find it installed through its stamp file.
COPY --chown=learner:learner . .
RUN pip install --no-deps -e . \
    && touch /opt/venv/.installed

EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "notebooks/"]
