"""What verifying a prepared corpus costs at load: sizes and sha256 of every file (`prepare.verify_prepared`).

    python benchmarks/prepared_verification.py --folder ~/.cache/huggingface/vanilla_transformer/prepared/<key>
    python benchmarks/prepared_verification.py --megabytes 1321     # a stand-in of the 4.5M-pair folder's size

Verification reads every byte once and hashes it; it parses nothing, so its cost depends on the folder's bytes
only. Without --folder, a stand-in folder of --megabytes of random bytes in 256 MB shards (the 4.5M-pair WMT-shaped
folder of docs/BENCHMARKS.md holds 1,321 MB) is written into --work_dir, recorded as a preparation records it, and
verified --repeats times. The first verification after writing reads from the page cache, as a relaunch on the same
machine does; a cold read from disk adds the disk's read time (not measurable here without dropping the caches).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the common module
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import describe_machine, machine  # noqa: E402

from vanilla_transformer.data import prepare  # noqa: E402
from vanilla_transformer.mechanics.integrity import files_problem, record_files  # noqa: E402

SHARD_MB = 256


def stand_in_folder(work_dir: Path, megabytes: int) -> Path:
    folder = work_dir / f"stand_in_{megabytes}mb"
    if not (folder / "files.json").is_file():
        (folder / "train").mkdir(parents=True, exist_ok=True)
        left, index = megabytes, 0
        while left > 0:
            size = min(left, SHARD_MB)
            (folder / "train" / f"data-{index:05d}.arrow").write_bytes(os.urandom(size << 20))
            left, index = left - size, index + 1
        (folder / "files.json").write_text(json.dumps(record_files(folder, excluded=["files.json"])))
    return folder


def time_verification(folder: Path, repeats: int) -> list[float]:
    if (folder / prepare.MANIFEST).is_file():
        verify = lambda: prepare.verify_prepared(folder)  # noqa: E731
    else:
        entries = json.loads((folder / "files.json").read_text())
        verify = lambda: files_problem(folder, entries)  # noqa: E731
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        assert verify() is None
        seconds.append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", help="a prepared folder (default: a stand-in of --megabytes)")
    parser.add_argument("--megabytes", type=int, default=1321)
    parser.add_argument("--work_dir", default="outputs/prepared_verification")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    folder = Path(args.folder) if args.folder else stand_in_folder(Path(args.work_dir), args.megabytes)
    megabytes = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20
    seconds = time_verification(folder, args.repeats)
    print(f"machine: {describe_machine(machine())}")
    print(f"{folder}: {megabytes:.0f} MB")
    for attempt, value in enumerate(seconds, start=1):
        print(f"verification {attempt}: {value:.2f} s ({megabytes / value:.0f} MB/s)")


if __name__ == "__main__":
    main()
