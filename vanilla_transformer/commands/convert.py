"""`vanilla-transformer convert`: a published Transformer of the paper's architecture as a model folder of
this project.

Its weights are copied exactly, or the conversion is refused by name (`pip install "vanilla-transformer[convert]"`).

    vanilla-transformer convert Helsinki-NLP/opus-mt-en-de opus-mt-en-de          # OPUS-MT (Marian): folder or Hub id
    vanilla-transformer convert FSMT_FOLDER_OR_HUB_ID fsmt-model                  # FSMT: folder or Hub id
    vanilla-transformer convert wmt16.en-de.joined-dict.transformer/model.pt wmt16-en-de \\
        --dictionary dict.en.txt dict.de.txt --bpe_codes bpecodes --source_lang en --target_lang de   # fairseq

A fairseq checkpoint's dictionary (dict.txt, or dict.SRC.txt and dict.TGT.txt, which must be the same) and BPE codes
(bpecodes) are looked for beside it when not given; its languages come from its settings unless given. A source the
paper's model cannot represent exactly (separate vocabularies, pre-LN layers, extra LayerNorms, learned positions, ...)
is refused naming the field and its value, and so is a fairseq checkpoint that would unpickle a class other than
argparse.Namespace. OUTPUT_DIR must be new or empty; --overwrite replaces a previous conversion there, nothing else.
Nothing is written before every check passed. What converts and how: vanilla_transformer/converters/.
"""

import sys
from collections.abc import Sequence

from vanilla_transformer.commands.flags import command_parser
from vanilla_transformer.commands.runner import MissingExtra, command


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer convert", __doc__)
    parser.add_argument("source", help="a Marian (OPUS-MT) or FSMT folder or Hub id, or a fairseq checkpoint file")
    parser.add_argument("output_dir", help="the folder to write the model to (new or empty)")
    parser.add_argument(
        "--dictionary", nargs="+", metavar="FILE", help="fairseq: the dictionary, or the source's and the target's"
    )
    parser.add_argument("--bpe_codes", metavar="FILE", help="fairseq: the subword-nmt BPE codes (default: bpecodes)")
    parser.add_argument("--source_lang", help="the source language (fairseq: default from the checkpoint's settings)")
    parser.add_argument("--target_lang", help="the target language")
    parser.add_argument("--license", help="the license the model card records (default: the source card's)")
    parser.add_argument("--revision", help="a Hub id's branch, tag or commit")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous conversion in output_dir")
    parser.add_argument(
        "--dtype",
        choices=("float32", "float16", "bfloat16"),
        help="the dtype of the folder's weights (default: the source's)",
    )
    args = parser.parse_args(argv)
    try:
        from vanilla_transformer.converters.convert import convert

        folder = convert(
            args.source,
            args.output_dir,
            dictionary=args.dictionary,
            bpe_codes=args.bpe_codes,
            source_lang=args.source_lang,
            target_lang=args.target_lang,
            license=args.license,
            revision=args.revision,
            overwrite=args.overwrite,
            dtype=args.dtype,
        )
    except ImportError as error:  # sentencepiece, sacremoses: what a source's tokenizer needs
        raise MissingExtra(f"{error}\nThe conversion needs: pip install 'vanilla-transformer[convert]'") from error
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
