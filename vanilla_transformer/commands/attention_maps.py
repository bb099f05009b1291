"""`vanilla-transformer attention-maps`: draw a saved model's attention weights for one sentence, as the paper's
appendix shows them.

    vanilla-transformer attention-maps MODEL_DIR --source "The house is small." --output_dir maps/
    vanilla-transformer attention-maps MODEL_DIR --source "..." --target "Das Haus ist klein." --output_dir maps/

Writes three PNG files, one per kind of attention (vanilla_transformer/serving/attention_maps.py says what they show),
and a record of them. An --output_dir that holds anything is refused; --overwrite replaces a previous attention-maps
output there, nothing else (the one rule: vanilla_transformer/mechanics/outputs.py).
"""

import sys
from collections.abc import Sequence
from pathlib import Path

from vanilla_transformer.commands.flags import (
    add_trust_remote_code,
    beam_size,
    command_parser,
    field_default,
    output_tokens,
    positive_int,
)
from vanilla_transformer.commands.runner import command
from vanilla_transformer.mechanics.outputs import (
    OutputFolderError,
    check_output_folder,
    why_not_recorded,
    write_recorded_folder,
)
from vanilla_transformer.training.settings import EvaluationSettings

WRITTEN_BY = "vanilla-transformer attention-maps"
# the PNG files written, with their sizes and sha256
ATTENTION_MAPS_RECORD = ".vanilla_transformer_attention_maps.json"


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer attention-maps", __doc__)
    parser.add_argument("model_dir", help="a saved model folder")
    parser.add_argument("--source", required=True, help="the sentence to encode")
    parser.add_argument("--target", help="its translation (default: the model's own, by beam search)")
    parser.add_argument("--output_dir", required=True, help="where to write the PNG files")
    parser.add_argument(
        "--num_beams",
        type=beam_size,
        default=field_default(EvaluationSettings, "num_beams"),
        help="beam size when translating (paper: 4)",
    )
    parser.add_argument(
        "--max_new_tokens", type=output_tokens, help="longest translation (default: source length + 50)"
    )
    parser.add_argument("--dpi", type=positive_int, default=100, help="resolution of the PNG files")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a previous attention-maps output in --output_dir (only that)"
    )
    add_trust_remote_code(parser)
    args = parser.parse_args(argv)
    if not args.source.strip():
        parser.error("--source is empty: give a sentence")
    if args.target is not None and not args.target.strip():
        parser.error("--target is empty: give a translation, or leave --target out to use the model's own")
    replacing = check_output_dir(parser, args)
    from vanilla_transformer.serving.attention_maps import draw_attention_maps
    from vanilla_transformer.serving.translate import code_note, load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(
        args.model_dir, attn_implementation="eager", trust_remote_code=args.trust_remote_code
    )
    if not args.trust_remote_code and (note := code_note(Path(args.model_dir))):
        print(note, file=sys.stderr)

    def draw(folder: Path) -> list[str]:
        paths = draw_attention_maps(
            model, tokenizer, args.source, folder, args.target, args.num_beams, args.max_new_tokens, args.dpi
        )
        return [path.name for path in paths.values()]

    names = write_recorded_folder(
        Path(args.output_dir),
        draw,
        replacing=replacing,
        record=ATTENTION_MAPS_RECORD,
        written_by=WRITTEN_BY,
        error=OutputFolderError,
        what="the attention maps",
    )
    for name in names:
        print(Path(args.output_dir) / name)
    return 0


def check_output_dir(parser, args) -> bool:
    """--output_dir by the one rule, before the model is loaded; True if it holds a previous output to replace."""
    output_dir = Path(args.output_dir).absolute()
    if blocking := next((path for path in (output_dir, *output_dir.parents) if path.is_file()), None):
        parser.error(f"--output_dir {args.output_dir}: {blocking} is a file, not a folder")
    return check_output_folder(
        args.output_dir,
        overwrite=args.overwrite,
        why_not_previous=lambda folder: why_not_recorded(folder, ATTENTION_MAPS_RECORD, WRITTEN_BY),
        previous=f"a previous `{WRITTEN_BY}` output",
        inputs=[("the model's folder", args.model_dir)],
    )


if __name__ == "__main__":
    sys.exit(main())
