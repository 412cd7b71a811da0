"""``python -m gpuformer_lib.predict validate [--write] | constants``: see :func:`gpuformer_lib.predict.main`."""

import sys

from gpuformer_lib.predict import main

sys.exit(main())
