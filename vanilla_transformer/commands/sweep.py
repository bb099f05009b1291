"""`vanilla-transformer sweep`: the paper's Table 3 as a command.

It trains Table 3's variations of the base model under a fixed budget each, then writes the table (JSON, CSV,
markdown) and one plot per row group.

    vanilla-transformer sweep --data_dir ../shared/data/multi30k --source_lang en --target_lang de \
        --validation_split val --test_split test_2016_flickr --scale small --rows base,A,D,E --minutes 10 \
        --output_dir outputs/table3
    vanilla-transformer sweep ... --scale base --steps 20000 \
        --launcher "accelerate launch --multi_gpu --num_processes 8"      # on GPUs, through Accelerate

Each row is one run of `vanilla-transformer train` (`python -m vanilla_transformer train`, or `LAUNCHER -m
vanilla_transformer train`), in its own folder under --output_dir/runs; every flag this command does not know goes to
it. The rows and how a sweep resumes: vanilla_transformer/training/sweep.py.
"""

import argparse
import sys

from vanilla_transformer.commands.arguments import preset_name
from vanilla_transformer.commands.flags import command_parser, field_default, positive_float, positive_int
from vanilla_transformer.commands.runner import command
from vanilla_transformer.training.sweep import GROUPS, Sweep, run_sweep, table3_variants

# the training flags each row of the table sets itself: refused among the flags passed on to every row
ROW_FLAGS = {
    "--output_dir",
    "--preset",
    "--layers",
    "--d_model",
    "--ffn_dim",
    "--heads",
    "--qk_head_dim",
    "--dropout",
    "--label_smoothing",
    "--position_embedding_type",
    "--max_minutes",
    "--max_steps",
    "--resume_from_checkpoint",
    "--overwrite",
    "--overwrite_output_dir",
}


def sweep_parser() -> argparse.ArgumentParser:
    parser = command_parser("vanilla-transformer sweep", __doc__)
    parser.add_argument(
        "--rows",
        default=",".join(field_default(Sweep, "rows")),
        help=f"row groups among {','.join(GROUPS)}, or single rows (D2, E1, ...)",
    )
    parser.add_argument(
        "--scale", type=preset_name, default=field_default(Sweep, "scale"), help="the base row's preset"
    )
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--minutes", type=positive_float, help="training budget of each row, wall clock")
    budget.add_argument("--steps", type=positive_int, help="training budget of each row, optimizer steps")
    parser.add_argument("--output_dir", required=True, help="rows' runs, logs, the table and the plots")
    parser.add_argument(
        "--launcher", help='prefix of each run, e.g. "accelerate launch --multi_gpu --num_processes 8"'
    )
    parser.add_argument(
        "--restart_rows",
        default="",
        help="rows (names, e.g. base,A1) whose earlier run in --output_dir is deleted and trained again",
    )
    return parser


def parse_args(argv=None) -> Sweep:
    parser = sweep_parser()
    args, training_flags = parser.parse_known_args(argv)
    names = {variant.name for variant in table3_variants(args.scale)}
    restart_rows = tuple(row for row in args.restart_rows.split(",") if row)
    if unknown := [row for row in restart_rows if row not in names]:
        parser.error(f"--restart_rows: unknown {unknown}; rows are {','.join(sorted(names))}")
    rows = ("base", *(row for row in args.rows.split(",") if row != "base"))
    if unknown := [row for row in rows if row not in GROUPS and row not in names]:
        parser.error(
            f"--rows: unknown {unknown}; choose groups among {','.join(GROUPS)} or "
            f"rows among {','.join(sorted(names))}"
        )
    if clashes := sorted(flag for flag in training_flags if flag.split("=")[0] in ROW_FLAGS):
        parser.error(f"{', '.join(clashes)}: set by each row of the table; remove them")
    return Sweep(
        output_dir=args.output_dir,
        scale=args.scale,
        minutes=args.minutes,
        steps=args.steps,
        launcher=args.launcher,
        rows=rows,
        restart_rows=restart_rows,
        training_flags=tuple(training_flags),
    )


@command
def main(argv=None) -> None:
    run_sweep(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
