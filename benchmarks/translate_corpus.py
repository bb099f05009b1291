"""stub"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from converted_speed import SIZES, opus_mt_folder  # noqa: E402

print(SIZES, opus_mt_folder)
