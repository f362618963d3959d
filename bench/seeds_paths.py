"""Where ``bench/seeds.py`` finds its data (the shared data folder beside the repository) and
its peers' runners, and the command that runs paramserver."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data")
PY = sys.executable
PS = [PY, "-m", "paramserver"]
SPARK = [PY, os.path.join(HERE, "seeds_spark.py")]
TF = [PY, os.path.join(HERE, "seeds_tf.py")]
MXNET = os.path.join(HERE, "seeds_mxnet.py")
HASHED = 1 << 24
