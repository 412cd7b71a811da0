# The course in a container: a CUDA base image, a Python virtual environment, a CUDA build of PyTorch pinned to
# one version, the course's requirements, JupyterLab on port 8888, and `make test` runnable inside.
#
#   docker build -t gpuformer .                          # needs a registry (Docker Hub) and the PyTorch index
#   docker run --gpus all -p 8888:8888 gpuformer         # JupyterLab; open the printed http://127.0.0.1:8888 URL
#   docker run --gpus all gpuformer make test            # the course's tests, inside the container
#   docker run --gpus all gpuformer make gpu-check       # the GPU checks (chapter 0), on a GPU
#   add -v /path/to/data:/home/learner/gpuformer/data to use data sets you already have (else they download)
#
# The image carries the CUDA runtime; the host carries only the NVIDIA driver and the NVIDIA Container Toolkit
# (`--gpus all`). The driver must support the CUDA version of the wheel (nvidia-smi prints the newest it supports).
# Chapter 16 explains each layer.

# The base image, pinned by its full tag (CUDA 12.8.1, cuDNN 9, Ubuntu 24.04), never `latest`: a rebuild next year
# gets the same system. For a byte-identical base, append its digest: FROM nvidia/cuda:<tag>@sha256:<digest>.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# One PyTorch version from one CUDA index. Change both together to a pair the index lists
# (https://download.pytorch.org/whl/torch/), e.g. TORCH_CUDA=cu130 on a driver that supports CUDA 13.0.
ARG TORCH_VERSION=2.13.0
ARG TORCH_CUDA=cu128

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    VENV=/opt/venv

# Python with venv, a C++ compiler (torch.compile's CPU backend and chapter 2's CUDA C kernel build), make, git.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ make git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# A non-root user owns the environment and the course.
RUN useradd --create-home --shell /bin/bash learner \
    && python3 -m venv /opt/venv \
    && chown -R learner:learner /opt/venv
USER learner
WORKDIR /home/learner/gpuformer

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
