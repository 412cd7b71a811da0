"""Chapters 0 and 1: memory, precision, the training state, the matmul's FLOPs."""

from answer_tables import Table, Wrong
from gpuformer_lib.exercises import hardware

TABLES = [
    Table(
        "check_weights_memory", hardware.check_weights_memory,
        right=(lambda n, dtype: n * dtype.itemsize / 2**30,),
        wrong=(Wrong("bytes", lambda n, dtype: n * dtype.itemsize, ("returned bytes",)),
               Wrong("GB not GiB", lambda n, dtype: n * dtype.itemsize / 1e9, ("GiB (2**30 bytes)",)),
               Wrong("always 4 bytes", lambda n, dtype: n * 4 / 2**30, ("dtype.itemsize",))),
    ),
]
