"""Write a Hugging Face Space (Gradio) that runs the demo, app.py, for a model on the Hub; optionally upload it.

    python -m vanilla_transformer.space your-name/vanilla-en-de --output_dir outputs/vanilla-transformer/space
    python -m vanilla_transformer.space your-name/vanilla-en-de --output_dir outputs/vanilla-transformer/space \
        --space_id your-name/vanilla-en-de-demo [--private] [--token TOKEN]

The Space's folder holds app.py, the code it runs (the model's files and the few library modules the demo imports:
no training code), requirements.txt and a README.md whose YAML header is the Space's configuration, naming the model
under `models:`, where app.py reads it (a MODEL_ID variable in the Space's settings overrides it). A subfolder of the
model folder, such as MODEL_DIR/space, stays local when the model is uploaded. The Space loads the model from the Hub
when it starts: upload the model first (`python -m vanilla_transformer.push_to_hub`). Offline or unreachable, the
upload fails with a message and the written files stay.
"""

import argparse
import shutil
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from huggingface_hub import HfApi

from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
from vanilla_transformer.hub import hub_failure

PROJECT = Path(__file__).resolve().parent.parent
# what app.py imports, by its path in the Space (= its path in this project)
SPACE_CODE = (
    "app.py",
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "pipeline_vanilla_transformer.py",
    "fast_paths_vanilla_transformer.py",
    "vanilla_transformer/__init__.py",
    "vanilla_transformer/attention_maps.py",
    "vanilla_transformer/cli.py",
    "vanilla_transformer/translate.py",
)
SPACE_FILES = (*SPACE_CODE, "requirements.txt", "README.md")
REQUIREMENTS = ("torch", f"transformers{SUPPORTED_TRANSFORMERS}", "matplotlib>=3.8.4", "huggingface_hub")
GRADIO_TESTED = "6.31.0"  # the Space's gradio when none is installed here: the release the demo was tested with
README_TEMPLATE = """---
title: {title}
emoji: 🔤
colorFrom: indigo
colorTo: green
sdk: gradio
sdk_version: {gradio}
app_file: app.py
models:
- {model_id}
license: apache-2.0
short_description: Translate with the 2017 Transformer and see its attention
---

# {title}

The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) from the model
[{model_id}](https://huggingface.co/{model_id}): type one sentence per line, pick the beam size and length penalty,
and look at the attention weights of any layer and head. The page is `app.py` of the vanilla-transformer project
(`python app.py {model_id}` runs it locally); `gradio_client.Client("{space_id}").predict(text,
api_name="/translate")` calls it from Python. Another model: set the variable MODEL_ID in the Space's settings.
"""


class SpaceError(Exception):
    """A Space that could not be written or uploaded, with the reason in one message."""


def write_space(model_id: str, output_dir: str | Path, space_id: str | None = None) -> list[Path]:
    """Write the Space's files for the Hub model `model_id` into `output_dir`; return their paths. A model folder
    (config.json) or a README.md that is not a Space's card is refused: the Space's README.md would replace it."""
    output_dir = Path(output_dir)
    readme = output_dir / "README.md"
    if (output_dir / "config.json").is_file():
        raise SpaceError(f"{output_dir} is a model folder: its model card would be replaced; use {output_dir}/space")
    if readme.is_file() and "\nsdk: gradio\n" not in readme.read_text(encoding="utf-8"):
        raise SpaceError(f"{readme} exists and is not a Space's card: choose another --output_dir")
    written = []
    for name in SPACE_CODE:
        (output_dir / name).parent.mkdir(parents=True, exist_ok=True)
        written.append(Path(shutil.copyfile(PROJECT / name, output_dir / name)))
    (output_dir / "requirements.txt").write_text("\n".join(REQUIREMENTS) + "\n", encoding="utf-8")
    title = f"{model_id.split('/')[-1]} demo"
    readme.write_text(
        README_TEMPLATE.format(
            title=title, gradio=gradio_version(), model_id=model_id, space_id=space_id or "SPACE_ID"
        ),
        encoding="utf-8",
    )
    return [*written, output_dir / "requirements.txt", readme]  # = SPACE_FILES


def gradio_version() -> str:
    try:
        return version("gradio")
    except PackageNotFoundError:
        return GRADIO_TESTED


def upload_space(folder: str | Path, space_id: str, token: str | None = None, private: bool = False) -> str:
    """Create the Gradio Space `space_id` if needed and upload `folder` to it; return its URL. Offline, unreachable
    or refused: SpaceError saying which; nothing local is changed."""
    try:
        api = HfApi(token=token)
        url = api.create_repo(space_id, repo_type="space", space_sdk="gradio", private=private, exist_ok=True)
        api.upload_folder(
            repo_id=space_id,
            repo_type="space",
            folder_path=folder,
            allow_patterns=list(SPACE_FILES),  # never the folder's caches or anything else it holds
            commit_message="vanilla-transformer demo",
        )
    except Exception as error:  # noqa: BLE001 - each failure of the Hub calls becomes one message
        raise SpaceError(hub_failure(error, f"upload {folder} to the Space {space_id}")) from error
    return str(url)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_id", help="the Hub model the Space translates with, as user/name")
    parser.add_argument("--output_dir", required=True, help="where to write the Space's files (e.g. MODEL_DIR/space)")
    parser.add_argument("--space_id", help="upload the files to this Space, as user/name (created if needed)")
    parser.add_argument("--private", action="store_true", help="create the Space as private")
    parser.add_argument("--token", help="a Hub token with write access (default: the logged-in one)")
    args = parser.parse_args(argv)
    try:
        paths = write_space(args.model_id, args.output_dir, args.space_id)
        print(f"wrote the Space's {len(paths)} files into {args.output_dir}")
        if args.space_id:
            print(f"uploaded the Space to {upload_space(args.output_dir, args.space_id, args.token, args.private)}")
    except SpaceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
