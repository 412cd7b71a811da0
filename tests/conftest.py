"""Fixtures for every test under ``tests/``.

A test's outcome must not depend on what the shell that started pytest had set (STYLE.md, habit 16): each
test starts without the variables that change the library's choices. A test that wants one sets it with
``monkeypatch.setenv``. ``GPUFORMER_DATA`` (where the data sets are), ``GPUFORMER_REQUIRE_BROWSER`` and ``GPUFORMER_REQUIRE_SANDBOX`` (set by
``.ci/run``) and ``GPUFORMER_SKIP_ONNX`` say what this machine has, not how the library behaves, and stay.
"""

import pytest

CHOICES_ENV = ("GPUFORMER_REHEARSE", "GPUFORMER_DEVICE", "GPUFORMER_PRESET", "GPUFORMER_BACKEND",
               "GPUFORMER_CHECK_TIME_LIMIT", "GPUFORMER_GRADE_LOG", "GPUFORMER_JOB")
"""Read by the library (profiles, device, distributed, exercise checks, grading) to change what it does."""


@pytest.fixture(autouse=True)
def no_inherited_choices(monkeypatch):
    for name in CHOICES_ENV:
        monkeypatch.delenv(name, raising=False)
